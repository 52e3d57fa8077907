"""`ColocateGRPOConfig`: a `trl.GRPOConfig` plus the engine and weight-sync options.

Precedence is dataclass defaults < YAML recipe (`--config`) < command-line flags, via `trl.TrlParser`, which also
rejects unknown YAML keys. Every cross-field check runs in `__post_init__`, i.e. at parse time, before any model or
engine loads, and raises `ValueError` naming the field and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import trl

from ..weight_sync.probe import DEFAULT_PROBE_TEXT
from .rewards import RewardOptions


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# `--resume_from_checkpoint true|false` on the command line (a path otherwise).
_BOOLEAN = {"true": True, "yes": True, "1": True, "false": None, "no": None, "0": None, "": None}


def _check_cpu_deepspeed_env() -> None:
    """A DeepSpeed launch on a CPU-only machine needs DeepSpeed's CPU accelerator chosen before it is imported; the
    CLI sets it (`trainer.cpu_sharding.configure_cpu_sharding_env`), Python users call that first."""
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")
    if deepspeed and os.environ.get("DS_ACCELERATOR") != "cpu":
        raise ValueError(
            "DeepSpeed on a CPU-only machine: DS_ACCELERATOR is not `cpu`; call "
            "`colocate_grpo.trainer.cpu_sharding.configure_cpu_sharding_env()` before building ColocateGRPOConfig "
            "(the `python -m colocate_grpo` CLI does), or export DS_ACCELERATOR=cpu DS_SKIP_SHM_OP=1."
        )


@dataclass
class ColocateGRPOConfig(trl.GRPOConfig, RewardOptions):
    """`trl.GRPOConfig` plus the colocated-engine and weight-sync settings.

    Reward-side options (`reward_on_error`, `overlong_*`, `dynamic_sampling*`) are documented in
    `colocate_grpo.config.rewards.RewardOptions`.

    Args:
        vllm_mode (`Literal["colocate", "server"]`, *optional*, defaults to `"colocate"`):
            Where generation runs: `colocate` builds a vLLM engine inside every training rank; `server` sends
            generation and weight updates to a server started with `python -m colocate_grpo.serve` (only the main
            process talks to it; see `colocate_grpo.server.remote`).
        vllm_server_base_url (`str`, *optional*):
            Server mode: the server's URL, e.g. `http://10.0.0.2:8000`; overrides `vllm_server_host` /
            `vllm_server_port`.
        vllm_server_host (`str`, *optional*, defaults to `"127.0.0.1"`):
            Server mode: host of the server (ignored when `vllm_server_base_url` is set).
        vllm_server_timeout (`float`, *optional*, defaults to `240`):
            Server mode: seconds to wait at start for the server to answer its health check (it may still be loading).
        vllm_server_request_timeout (`float`, *optional*, defaults to `300`):
            Server mode: seconds one request (a generation batch, a weight bucket) may take before it is retried.
        vllm_server_retries (`int`, *optional*, defaults to `2`):
            Server mode: retries of a request that could not connect or timed out (with 1 s, 2 s, ... back-off);
            after them every rank stops with `ServerError` naming the URL.
        vllm_server_weight_transport (`Literal["auto", "http", "nccl"]`, *optional*, defaults to `"auto"`):
            Server mode: how weight buckets travel. `http` posts each bucket as one safetensors body (CPU or GPU);
            `nccl` announces each bucket over HTTP and broadcasts its bytes GPU to GPU. `auto`: nccl when the
            trainer has CUDA, http otherwise.
        vllm_server_message_mb (`float`, *optional*, defaults to `32`):
            Server mode: largest weight message in MiB; buckets (`weight_sync_bucket_mb`) are split into messages of
            this size. Measured on CPU loopback: 32 MiB messages 0.88 s per sync, 256 MiB 1.81 s, per tensor 1.49 s.
        vllm_dtype (`Literal["auto", "float32", "bfloat16", "float16"]`, *optional*):
            Engine dtype. `auto` is what vLLM does: the checkpoint's dtype, with float32 checkpoints downcast to
            bfloat16 (on CPU and on bf16-capable GPUs alike). Unset: `auto` on GPU; on CPU `bfloat16` where the CPU
            computes it natively (AVX512-BF16 / AMX; bf16 decode measured 1.3-2.2x faster than float32 there) and
            `float32` where bf16 is emulated (AVX2 only: 3.8x slower). Every derived setting (probe statistic and
            tolerance, digest, importance-sampling shortcut) reads the dtype the engine resolved, never this string.
        vllm_enforce_eager (`bool`, *optional*, defaults to `False`):
            Skip CUDA graphs / torch.compile: faster engine start, slower decoding (on CPU, SmolLM2-135M fp32 decodes
            at 47 tok/s eager vs 81 tok/s compiled, one thread).
        vllm_cpu_kvcache_space_gb (`int`, *optional*, defaults to `2`):
            KV-cache GiB per rank on CPU (vLLM-CPU ignores `vllm_gpu_memory_utilization` for it).
        weight_sync_probe (`bool`, *optional*, defaults to `True`):
            Verify every sync by comparing trainer and engine logprobs on a fixed sequence.
        weight_sync_probe_tolerance (`float`, *optional*):
            Tolerance of the probe, by default from the dtypes really in use (`weight_sync.probe.probe_settings`):
            max |logprob difference| 1e-3 when engine and trainer run float32; with a 16-bit engine and a float32
            trainer, 4x the trainer's own rounding error in the engine's dtype; with a 16-bit trainer, mean
            |logprob difference| 0.5 (bf16) / 0.1 (fp16).
        weight_sync_digest (`bool`, *optional*, defaults to `True`):
            After every sync, check exactly (bit for bit, per layer, in the engine's dtype) that the engine holds the
            weights that were sent: catches skipped, partial and wrong loads in every precision, where the probe
            alone cannot see one missed step in 16 bits. Costs one pass over the weights on each side.
        weight_sync_probe_text (`str`, *optional*):
            Text of the probe sequence.
        logprob_impl (`Literal["auto", "plain", "fused"]`, *optional*, defaults to `"auto"`):
            How the loss scores completions: plain completion-only logits, or TRL's fused chunked LM head (saves
            memory on large vocabularies). `auto` is plain on CPU, fused on GPU.
        plot_metrics (`bool`, *optional*, defaults to `True`):
            Write `metrics.png` (reward and step time) to `output_dir` at the end of training.
        weight_sync_lora_mode (`Literal["merged", "adapter"]`, *optional*, defaults to `"merged"`):
            How a PEFT LoRA policy reaches the engine: `merged` sends base weights with the adapters merged in
            (every backend, any adapter); `adapter` sends the frozen base once and then only the LoRA factors into
            vLLM's LoRA support (megabytes per step; no modules_to_save/DoRA/bias; on CPU vLLM disables
            torch.compile when LoRA is enabled).
        weight_sync_bucket_mb (`float`, *optional*, defaults to `256`):
            Cap on the extra memory a sync uses: sharded parameters (FSDP, ZeRO-3) are gathered and handed to the
            engine in buckets of at most this many MiB (a single tensor, or an FSDP1 unit, larger than that is
            gathered alone).
    """

    use_vllm: bool = field(
        default=True, metadata={"help": "Always true: generation runs in the colocated engine."}
    )
    vllm_mode: Literal["colocate", "server"] = field(
        default="colocate",
        metadata={
            "help": "colocate: vLLM inside every rank; server: a `python -m colocate_grpo.serve` server."
        },
    )
    vllm_server_host: str = field(
        default="127.0.0.1",
        metadata={"help": "Server mode: server host (ignored with vllm_server_base_url)."},
    )
    vllm_server_request_timeout: float = field(
        default=300.0, metadata={"help": "Server mode: seconds one request may take before it is retried."}
    )
    vllm_server_retries: int = field(
        default=2, metadata={"help": "Server mode: retries of a request that failed to connect or timed out."}
    )
    vllm_server_weight_transport: Literal["auto", "http", "nccl"] = field(
        default="auto",
        metadata={
            "help": "Server mode: weight buckets over http (safetensors) or nccl; auto = nccl on CUDA."
        },
    )
    vllm_server_message_mb: float = field(
        default=32.0, metadata={"help": "Server mode: largest weight message in MiB (buckets are split)."}
    )
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = field(
        default=None,
        metadata={
            "help": "Engine dtype; auto = vLLM's rule (float32 checkpoints -> bfloat16). Unset: auto on GPU, "
            "bfloat16 on CPUs with native bf16, float32 on others."
        },
    )
    vllm_enforce_eager: bool = field(
        default=False,
        metadata={"help": "Disable CUDA graphs / torch.compile in the engine (faster start, slower decode)."},
    )
    vllm_cpu_kvcache_space_gb: int = field(default=2, metadata={"help": "KV-cache GiB per rank on CPU."})
    weight_sync_probe: bool = field(
        default=True, metadata={"help": "Verify every weight sync with a logprob probe."}
    )
    weight_sync_digest: bool = field(
        default=True,
        metadata={"help": "Check exactly, per layer, that the engine holds what each sync sent."},
    )
    weight_sync_probe_tolerance: float | None = field(
        default=None,
        metadata={
            "help": "Probe tolerance (default from the real dtypes: see weight_sync.probe.probe_settings)."
        },
    )
    weight_sync_probe_text: str = field(
        default=DEFAULT_PROBE_TEXT, metadata={"help": "Text of the probe sequence."}
    )
    logprob_impl: Literal["auto", "plain", "fused"] = field(
        default="auto",
        metadata={"help": "Loss logprobs: plain logits or TRL's fused LM head (auto: plain on CPU)."},
    )
    plot_metrics: bool = field(
        default=True, metadata={"help": "Save metrics.png (reward, step time) at the end."}
    )
    weight_sync_lora_mode: Literal["merged", "adapter"] = field(
        default="merged",
        metadata={
            "help": "LoRA sync: merge adapters into base weights, or send only the adapter (vLLM LoRA)."
        },
    )
    weight_sync_bucket_mb: float = field(
        default=256,
        metadata={"help": "Most MiB of gathered (un-sharded) weights held at once during a sync."},
    )

    def __post_init__(self):
        on_gpu = _cuda_available()
        if not on_gpu:
            # accelerate only builds a multi-process gloo world (MULTI_CPU) when told the run is on CPU; without
            # this, every rank of a 2-process launch would silently train alone.
            self.use_cpu = True
            if self.bf16 is None and not self.fp16:
                self.bf16 = False  # bf16 is emulated (slow) on CPUs without AVX512-BF16
            _check_cpu_deepspeed_env()  # before TrainingArguments builds a DeepSpeed plugin
        self._check_fields(on_gpu)
        self._check_numbers()
        if isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() in _BOOLEAN:
            # `--resume_from_checkpoint true` on the command line arrives as the string "true" (YAML gives True).
            self.resume_from_checkpoint = _BOOLEAN[self.resume_from_checkpoint.lower()]
        super().__post_init__()
        self.check_reward_options()
        world = self.launch_world_size
        if world % self.vllm_tensor_parallel_size:
            raise ValueError(
                f"vllm_tensor_parallel_size={self.vllm_tensor_parallel_size} must divide the number of processes "
                f"({world}); use a divisor of {world} or launch a multiple of it."
            )

    def _check_fields(self, on_gpu: bool) -> None:
        if not self.use_vllm:
            raise ValueError(
                "use_vllm=false: ColocateGRPOTrainer always generates with its colocated engine; use "
                "trl.GRPOTrainer for transformers generation."
            )
        if self.vllm_mode == "server":
            self._check_server_fields(on_gpu)
        if self.vllm_structured_outputs_regex:
            raise ValueError(
                "vllm_structured_outputs_regex: ColocateGRPOTrainer does not constrain generation yet; remove it (or "
                "use trl.GRPOTrainer for regex-guided decoding)."
            )
        if (
            os.environ.get("FSDP_VERSION", "1") == "1"
            and os.environ.get("FSDP_USE_ORIG_PARAMS", "").lower() == "false"
        ):
            raise ValueError(
                "fsdp_use_orig_params=false: the FSDP1 weight sync reads the original parameters inside each unit; "
                "set `fsdp_use_orig_params: true` in the accelerate config (see accelerate_configs/fsdp1_cpu.yaml)."
            )
        fsdp1 = (
            os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
            and os.environ.get("FSDP_VERSION", "1") == "1"
        )
        if fsdp1 and not on_gpu and self.save_strategy != "no":
            # accelerate's save_fsdp_model forces offload_to_cpu on multi-process full state dicts, and offloading
            # CPU tensors makes FSDP1 free their storage: rank 0 dies with SIGSEGV in the first checkpoint.
            raise ValueError(
                f"save_strategy={self.save_strategy} with FSDP1 on CPU: accelerate's checkpoint writer crashes there; "
                "use FSDP2 (accelerate_configs/fsdp2_cpu.yaml) or ZeRO-3 for checkpointed CPU runs, or "
                "save_strategy: no (the final model is still saved)."
            )
        if self.weight_sync_bucket_mb <= 0:
            raise ValueError(
                f"weight_sync_bucket_mb must be > 0, got {self.weight_sync_bucket_mb}; it caps the extra memory a "
                "sync gathers at once (e.g. 256)."
            )
        if self.vllm_tensor_parallel_size < 1:
            raise ValueError(f"vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}.")
        if self.vllm_enable_sleep_mode and not on_gpu:
            raise ValueError(
                "vllm_enable_sleep_mode=true: vLLM does not support sleep mode on CPU; set it to false (it only "
                "saves GPU memory)."
            )
        if self.weight_sync_probe_tolerance is not None and not self.weight_sync_probe_tolerance > 0:
            raise ValueError(
                f"weight_sync_probe_tolerance must be > 0, got {self.weight_sync_probe_tolerance}."
            )
        if not self.max_completion_length or self.max_completion_length < 1:
            raise ValueError(f"max_completion_length must be >= 1, got {self.max_completion_length}.")
        if self.vllm_cpu_kvcache_space_gb < 1:
            raise ValueError(f"vllm_cpu_kvcache_space_gb must be >= 1, got {self.vllm_cpu_kvcache_space_gb}.")

    def _check_numbers(self) -> None:
        """Numbers no run can train with, named before anything loads (TRL would fail late or silently)."""
        positive = (
            "learning_rate",
            "temperature",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
        )
        for name in (*positive, "num_iterations", "steps_per_generation"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(
                    f"{name} must be > 0, got {value} (e.g. learning_rate: 1e-6, temperature: 1.0)."
                )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}; 1.0 disables nucleus sampling.")
        if self.max_steps == 0 or (self.max_steps < 0 and not self.num_train_epochs > 0):
            raise ValueError(
                f"max_steps={self.max_steps} / num_train_epochs={self.num_train_epochs} train nothing; set "
                "max_steps > 0 or num_train_epochs > 0 (max_steps: -1 means train for num_train_epochs)."
            )
        if self.beta < 0 or self.num_generations is not None and self.num_generations < 2:
            raise ValueError(
                f"beta must be >= 0 and num_generations >= 2 (GRPO compares completions within a group), got "
                f"beta={self.beta}, num_generations={self.num_generations}."
            )

    def _check_server_fields(self, on_gpu: bool) -> None:
        from urllib.parse import urlparse

        url = urlparse(self.server_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"vllm_server_base_url={self.vllm_server_base_url!r} is not an http URL; use e.g. "
                "http://127.0.0.1:8000 (or set vllm_server_host and vllm_server_port)."
            )
        if not 0 < self.vllm_server_port < 65536:
            raise ValueError(f"vllm_server_port must be in 1..65535, got {self.vllm_server_port}.")
        for name in ("vllm_server_timeout", "vllm_server_request_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}.")
        if not self.vllm_server_message_mb > 0:
            raise ValueError(f"vllm_server_message_mb must be > 0 MiB, got {self.vllm_server_message_mb}.")
        if self.vllm_server_retries < 0:
            raise ValueError(f"vllm_server_retries must be >= 0, got {self.vllm_server_retries}.")
        # While the main process waits on the server, the other ranks wait in a collective; it must outlast every
        # retry, or those ranks would die of a collective timeout instead of the server error.
        worst = (
            self.vllm_server_retries + 1
        ) * self.vllm_server_request_timeout + 2**self.vllm_server_retries
        if worst >= self.ddp_timeout:
            raise ValueError(
                f"vllm_server_request_timeout x (vllm_server_retries + 1) = {worst:.0f} s must stay below ddp_timeout "
                f"({self.ddp_timeout} s), the limit of the collectives the other ranks wait in; lower the request "
                "timeout or raise ddp_timeout."
            )
        if self.vllm_server_weight_transport == "nccl" and not on_gpu:
            raise ValueError(
                "vllm_server_weight_transport=nccl needs CUDA on the trainer; use http (or auto) on CPU machines."
            )
        if self.vllm_tensor_parallel_size != 1:
            raise ValueError(
                "vllm_tensor_parallel_size applies to colocate mode; in server mode pass --tensor-parallel-size to "
                "`python -m colocate_grpo.serve` and leave vllm_tensor_parallel_size at 1."
            )
        if self.vllm_enable_sleep_mode:
            raise ValueError(
                "vllm_enable_sleep_mode applies to colocate mode; set it to false in server mode."
            )
        if self.vllm_model_impl == "transformers":
            raise ValueError(
                "vllm_model_impl applies to colocate mode; in server mode pass --model-impl transformers to "
                "`python -m colocate_grpo.serve` and leave vllm_model_impl at its default."
            )

    def engine_kwargs(self, max_num_seqs: int, lora: dict | None = None) -> dict:
        """`ColocatedEngine` keyword arguments for this run (`max_num_seqs` comes from TRL's batch arithmetic, `lora`
        from the PEFT model: see `trainer.generation`)."""
        return {
            "tensor_parallel_size": self.vllm_tensor_parallel_size,
            "dtype": self.vllm_dtype,
            "max_model_len": self.vllm_max_model_length,
            "max_num_seqs": max_num_seqs,
            "gpu_memory_utilization": self.vllm_gpu_memory_utilization,
            "enable_sleep_mode": self.vllm_enable_sleep_mode,
            "enforce_eager": self.vllm_enforce_eager,
            "seed": self.seed,
            "lora": lora,
            "trust_remote_code": self.trust_remote_code,
            "model_impl": self.vllm_model_impl,
        }

    @property
    def server_url(self) -> str:
        """The server's base URL, without a trailing slash."""
        if self.vllm_server_base_url:
            return self.vllm_server_base_url.rstrip("/")
        return f"http://{self.vllm_server_host}:{self.vllm_server_port}"

    @property
    def server_transport(self) -> str:
        if self.vllm_server_weight_transport != "auto":
            return self.vllm_server_weight_transport
        return "nccl" if _cuda_available() else "http"

    @property
    def resolved_logprob_impl(self) -> str:
        if self.logprob_impl != "auto":
            return self.logprob_impl
        return "fused" if _cuda_available() else "plain"

    @property
    def launch_world_size(self) -> int:
        """Processes started by the launcher (torchrun/accelerate export WORLD_SIZE before any state exists)."""
        return int(os.environ.get("WORLD_SIZE", self.world_size))

    @property
    def local_world_size(self) -> int:
        return int(os.environ.get("LOCAL_WORLD_SIZE", self.launch_world_size))
