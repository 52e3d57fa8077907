"""Typed configuration: script arguments (data, rewards) and `ColocateGRPOConfig`, a `trl.GRPOConfig`.

Precedence is dataclass defaults < YAML recipe (`--config`) < command-line flags, via `trl.TrlParser`, which also
rejects unknown YAML keys. Every cross-field check runs in `__post_init__`, i.e. at parse time, before any model or
engine loads, and raises `ValueError` naming the field and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import trl

from .weight_sync.probe import DEFAULT_PROBE_TEXT


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class ScriptArguments(trl.ScriptArguments):
    """Data and reward arguments (TRL / open-r1 naming).

    Args:
        dataset_name (`str`):
            A hub id, a local file/folder (json, jsonl, parquet, csv), or a built-in offline task
            `reasoning_gym:<task>` (e.g. `reasoning_gym:basic_arithmetic`, `reasoning_gym:gsm_symbolic`).
        dataset_size (`int`, *optional*, defaults to `512`):
            Number of examples generated for a `reasoning_gym:` task.
        prompt_column (`str`, *optional*, defaults to `"prompt"`):
            Column holding the question text (or a ready list of chat messages).
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the reference answer, passed to rewards as `answer`.
        system_prompt (`str`, *optional*):
            System message prepended to every prompt.
        reward_funcs (`list[str]`, *optional*, defaults to `["accuracy", "format"]`):
            Reward names from `colocate_grpo.rewards.REGISTRY`, or dotted paths `pkg.module.func` to user functions.
    """

    dataset_size: int = field(default=512, metadata={"help": "Examples generated for a reasoning_gym: task."})
    prompt_column: str = field(
        default="prompt", metadata={"help": "Column with the question text or messages."}
    )
    answer_column: str = field(default="answer", metadata={"help": "Column with the reference answer."})
    system_prompt: str | None = field(
        default=None, metadata={"help": "System message prepended to every prompt."}
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy", "format"],
        metadata={"help": "Reward names (see colocate_grpo.rewards) or dotted paths to user functions."},
    )

    def __post_init__(self):
        if not self.dataset_name:
            raise ValueError("dataset_name is required: a hub id, a local file, or reasoning_gym:<task>.")
        if self.dataset_size < 1:
            raise ValueError(f"dataset_size must be >= 1, got {self.dataset_size}.")
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: list at least one reward, e.g. [accuracy].")
        from .rewards import check_reward_names

        check_reward_names(self.reward_funcs)


@dataclass
class ColocateGRPOConfig(trl.GRPOConfig):
    """`trl.GRPOConfig` plus the colocated-engine and weight-sync settings.

    Args:
        vllm_mode (`Literal["colocate"]`, *optional*, defaults to `"colocate"`):
            Where generation runs. Only the in-process engine is available in this release.
        vllm_dtype (`Literal["auto", "float32", "bfloat16", "float16"]`, *optional*, defaults to `"auto"`):
            Engine dtype; `auto` is float32 on CPU (bf16 is emulated there) and the checkpoint dtype on GPU.
        vllm_enforce_eager (`bool`, *optional*, defaults to `False`):
            Skip CUDA graphs / torch.compile: faster engine start, slower decoding (on CPU, SmolLM2-135M fp32 decodes
            at 47 tok/s eager vs 81 tok/s compiled, one thread).
        vllm_cpu_kvcache_space_gb (`int`, *optional*, defaults to `2`):
            KV-cache GiB per rank on CPU (vLLM-CPU ignores `vllm_gpu_memory_utilization` for it).
        weight_sync_probe (`bool`, *optional*, defaults to `True`):
            Verify every sync by comparing trainer and engine logprobs on a fixed sequence.
        weight_sync_probe_tolerance (`float`, *optional*):
            Max allowed |logprob difference|; defaults to 1e-3 for float32 engines, 0.5 for half precision
            (see `colocate_grpo.weight_sync.probe.default_tolerance`).
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
    vllm_mode: Literal["colocate"] = field(
        default="colocate", metadata={"help": "Generation backend: the in-process colocated engine."}
    )
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata={"help": "Engine dtype; auto = float32 on CPU, checkpoint dtype on GPU."}
    )
    vllm_enforce_eager: bool = field(
        default=False,
        metadata={"help": "Disable CUDA graphs / torch.compile in the engine (faster start, slower decode)."},
    )
    vllm_cpu_kvcache_space_gb: int = field(default=2, metadata={"help": "KV-cache GiB per rank on CPU."})
    weight_sync_probe: bool = field(
        default=True, metadata={"help": "Verify every weight sync with a logprob probe."}
    )
    weight_sync_probe_tolerance: float | None = field(
        default=None,
        metadata={"help": "Max |logprob diff| allowed (default 1e-3 fp32, 0.5 half precision)."},
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
            from .launch import configure_cpu_sharding_env

            configure_cpu_sharding_env()  # before TrainingArguments builds a DeepSpeed plugin
        self._check_fields(on_gpu)
        super().__post_init__()
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
        if self.vllm_mode != "colocate":
            raise ValueError(f"vllm_mode={self.vllm_mode!r}: only 'colocate' is available in this release.")
        if (
            os.environ.get("FSDP_VERSION", "1") == "1"
            and os.environ.get("FSDP_USE_ORIG_PARAMS", "").lower() == "false"
        ):
            raise ValueError(
                "fsdp_use_orig_params=false: the FSDP1 weight sync reads the original parameters inside each unit; "
                "set `fsdp_use_orig_params: true` in the accelerate config (see accelerate_configs/fsdp1_cpu.yaml)."
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

    @property
    def engine_dtype(self) -> str:
        """The dtype string handed to vLLM."""
        if self.vllm_dtype != "auto":
            return self.vllm_dtype
        return "auto" if _cuda_available() else "float32"

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
