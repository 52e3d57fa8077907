"""The generation backend TRL's GRPOTrainer calls: where a weight goes from the optimizer step to vLLM.

`ColocatedGeneration` has the interface TRL's trainer calls on its generation backend (`sync_weights()` once per
new set of weights, `generate(...)` every generation round), and composes parts built without a trainer: an
`Engine` (`engine.colocated.ColocatedEngine` in this process, or `server.remote.RemoteEngine`), a weight source
(`colocate_grpo.weight_sync`) and the two verifications (`DigestCheck`, `SyncProbe`). `build_generation` builds them
from a `ColocateGRPOConfig`; TRL reaches it only through `trainer._trl.generation_backend`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.distributed as dist

from ..engine.base import Engine
from ..engine.colocated import ColocatedEngine
from ..engine.lora import serving_settings
from ..engine.sampling import SamplingConfig, request_seed
from ..hardware import cores_per_process
from ..server.remote import RemoteEngine
from ..weight_sync import SyncProbe
from ..weight_sync.digest import DigestCheck
from ..weight_sync.sources import adapter_source, local_fraction, unwrap, weight_buckets
from ._trl import llm_view

MetricSink = Callable[[str, float], None]


def _now() -> float:
    """Wall clock after the GPU's queued work: timings of asynchronous CUDA work would otherwise end too early."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class ColocatedGeneration:
    """Generation backend for `ColocateGRPOTrainer`.

    Args:
        model (`torch.nn.Module`):
            The policy being trained (possibly wrapped); read by the weight source and the probe.
        engine (`Engine`):
            This rank's engine, or (server mode) the collective stand-in for the remote server.
        sampling (`SamplingConfig`):
            Sampling settings for rollouts.
        probe (`SyncProbe`, *optional*):
            Verification run after every sync; `None` disables it.
        bucket_bytes (`int`, *optional*, defaults to 256 MiB):
            Most gathered bytes a sync holds at once (see `colocate_grpo.weight_sync.sources`).
        lora_mode (`str`, *optional*, defaults to `"merged"`):
            For PEFT LoRA policies: `"merged"` sends base weights with the adapters merged in; `"adapter"` sends the
            frozen base once, then only the adapter factors (the engine must be built with LoRA support).
        digest (`DigestCheck`, *optional*):
            Exact check, after every sync that loads base weights, that the engine holds what was sent.
        seed (`int`, *optional*):
            Base of the per-request sampling seeds (mixed with the step and the call within it); `None` leaves
            sampling to the engine's global RNG.
        sleep_level (`int`, *optional*, defaults to `1`):
            Sleep-mode level used by `release` in training: 2 only when every weight is re-sent at every sync and
            every training generation follows a sync (see `sleep_level_for`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        engine: Engine,
        sampling: SamplingConfig,
        probe: SyncProbe | None = None,
        bucket_bytes: int | None = 256 << 20,
        lora_mode: str = "merged",
        digest: DigestCheck | None = None,
        seed: int | None = 0,
        sleep_level: int = 1,
    ):
        self.lora_mode = lora_mode
        self.digest, self.seed, self.sleep_level = digest, seed, sleep_level
        # (step, generate calls in that step): the seed of the next call derives from it.
        self._calls = (-1, 0)
        self._base_sent = False  # frozen tensors reach the engine once, with the first sync
        self.model_fn: Callable[[], torch.nn.Module] = lambda: model
        self.bucket_bytes = bucket_bytes
        self.engine = engine
        self.llm = llm_view(engine.max_model_len)  # all TRL's tool loop reads of `.llm`
        # TRL's trainer asks the server for its logprobs mode (server mode, main process).
        self.vllm_client = engine.client if isinstance(engine, RemoteEngine) else None
        self.sampling = sampling
        self.probe = probe
        self.step_fn: Callable[[], int] = lambda: -1
        self.log_metric: MetricSink = lambda name, value: None
        self.sync_count = 0

    def bind(
        self,
        log_metric: MetricSink,
        step_fn: Callable[[], int],
        model_fn: Callable[[], torch.nn.Module] | None = None,
    ) -> None:
        """Attach the trainer's metric sink, step counter and, optionally, a getter for the policy as currently
        wrapped (the Trainer wraps it in FSDP / DeepSpeed only when training starts); kept out of `__init__` so
        tests need no trainer."""
        self.log_metric, self.step_fn = log_metric, step_fn
        if model_fn is not None:
            self.model_fn = model_fn

    def sync_weights(self) -> None:
        """Push the current policy weights into the engine, then verify them: the digest (exact: the engine holds
        what was sent) and the probe (the engine computes what the trainer computes).

        Every rank calls this once per optimizer step (TRL tracks the last loaded step), so gathers inside the
        source line up across ranks and the verifications' reductions see every rank.
        """
        model = self.model_fn()
        start = _now()
        if self.lora_mode == "adapter":
            count, nbytes, base_loaded = self._sync_adapter(model)
        else:
            buckets = weight_buckets(model, self.bucket_bytes, trainable_only=self._base_sent)
            count, nbytes = self.engine.load_buckets(self.digest.track(buckets) if self.digest else buckets)
            self._base_sent = base_loaded = True
        seconds = _now() - start
        self.sync_count += 1
        self.log_metric("sync/seconds", seconds)
        self.log_metric("sync/bytes", float(nbytes))
        self.log_metric("sync/tensors", float(count))
        self.log_metric("sync/gbytes_per_second", nbytes / max(seconds, 1e-9) / 1e9)
        self.log_metric("sync/local_param_fraction", local_fraction(model))
        start = _now()
        if self.digest is not None and base_loaded:
            self.log_metric(
                "sync/digest_mismatched_layers", float(len(self.digest.check(self.engine, self.step_fn())))
            )
        if self.probe is not None:
            stats = self.probe.check(model, self.engine, self.step_fn())
            self.log_metric("sync/probe_max_logprob_diff", stats["max"])
            self.log_metric("sync/probe_mean_logprob_diff", stats["mean"])
            if self.probe.statistic == "ratio":  # 16-bit engine: its error over bf16/fp16 rounding's own
                self.log_metric("sync/probe_rounding_noise", stats["noise"])
                self.log_metric("sync/probe_ratio", stats["ratio"])
        self.log_metric("sync/verify_seconds", _now() - start)

    def _sync_adapter(self, model: torch.nn.Module) -> tuple[int, int, bool]:
        """Adapter-only sync: the frozen base weights once (first sync), then the LoRA factors every time."""
        count = nbytes = 0
        base_loaded = not self._base_sent
        if base_loaded:
            buckets = weight_buckets(model, self.bucket_bytes, merge_lora=False)
            count, nbytes = self.engine.load_buckets(self.digest.track(buckets) if self.digest else buckets)
            self._base_sent = True
        # Copied out of the gather buffers (freed bucket by bucket); adapters are megabytes.
        tensors = {name: t.clone() for name, t in adapter_source(model, self.bucket_bytes)}
        peft_model = unwrap(model)
        config = peft_model.peft_config[peft_model.active_adapter].to_dict()
        return count + len(tensors), nbytes + self.engine.load_adapter(tensors, config), base_loaded

    def release(self, training: bool) -> None:
        """Let the engine free its GPU memory (sleep mode) once a step's generations are done: the trainer calls this
        after preparing its inputs. Level 2 (weights discarded) only in training, where the next generation always
        follows a full sync; after evaluation generations, training may still generate on these weights."""
        self.engine.sleep(self.sleep_level if training else 1)

    def generate(self, prompts: list[list[int]], images, num_generations: int, profiler=None) -> tuple:
        """Generate one completion per prompt id list (TRL has already repeated each prompt `num_generations` times).

        Returns:
            `tuple`: `(prompt_ids, completion_ids, logprobs, None)` with logprobs shaped `[batch, completion_len, 1]`,
            the layout TRL's trainer unpacks.
        """
        if images is not None and any(img is not None for img in images):
            raise NotImplementedError("ColocateGRPOTrainer does not support image prompts yet.")
        step, calls = self._calls
        self._calls = (self.step_fn(), calls + 1 if step == self.step_fn() else 1)
        sampling = self.sampling
        if self.seed is not None:
            # A function of (seed, step, call): a resumed run draws what the uninterrupted one would have drawn.
            sampling = replace(sampling, seed=request_seed(self.seed, self._calls[0], self._calls[1]))
        start = _now()
        with profiler or nullcontext():
            out = self.engine.generate(prompts, sampling)
        seconds = _now() - start
        tokens = sum(len(c) for c in out.completion_ids)
        self.log_metric("generation/seconds", seconds)
        self.log_metric("generation/tokens_per_second", tokens / max(seconds, 1e-9))
        logprobs = [[[lp] for lp in seq] for seq in out.logprobs]
        return out.prompt_ids, out.completion_ids, logprobs, None


def build_generation(
    model: torch.nn.Module, processing_class, args, max_num_seqs: int
) -> ColocatedGeneration:
    """Build engine, sampling and verifications from a `ColocateGRPOConfig` (the trainer's one entry point here).

    Everything that depends on the engine's precision (probe statistic and tolerance, digest dtype) reads the dtype
    the engine really resolved after it was built, not the `vllm_dtype` string.
    """
    from ..weight_sync.probe import probe_settings

    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if args.vllm_mode == "server":
        engine = build_remote_engine(model, args)
    else:
        engine = build_colocated_engine(model, args, max_num_seqs)
    sampling = SamplingConfig(
        max_tokens=args.max_completion_length,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k if args.top_k and args.top_k > 0 else -1,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
        extra=dict(args.generation_kwargs or {}),
    )
    probe = None
    if args.weight_sync_probe:
        statistic, tolerance = probe_settings(engine.dtype, model.dtype)
        tolerance = args.weight_sync_probe_tolerance or tolerance
        probe = SyncProbe.from_text(
            tokenizer, args.weight_sync_probe_text, tolerance, statistic, engine.dtype
        )
    digest = DigestCheck(engine.dtype) if args.weight_sync_digest else None
    return ColocatedGeneration(
        model,
        engine,
        sampling,
        probe,
        bucket_bytes=int(args.weight_sync_bucket_mb * (1 << 20)),
        lora_mode=args.weight_sync_lora_mode,
        digest=digest,
        seed=args.seed,
        sleep_level=sleep_level_for(model, args),
    )


def sleep_level_for(model: torch.nn.Module, args) -> int:
    """2 (discard weights while asleep) when that is safe and saves two GPU<->host copies of the model per step:
    every parameter is trainable, so each sync re-sends every weight (frozen ones are sent once only), and every
    training generation starts a new optimizer step, so a sync always comes first. 1 otherwise."""
    full_finetune = all(p.requires_grad for p in model.parameters())
    generate_every = args.steps_per_generation * args.num_iterations
    return 2 if full_finetune and generate_every % args.gradient_accumulation_steps == 0 else 1


def build_colocated_engine(model: torch.nn.Module, args, max_num_seqs: int) -> ColocatedEngine:
    """This rank's in-process engine."""
    from ..engine.runtime import configure_cpu_runtime

    configure_cpu_runtime(args.local_world_size, args.vllm_cpu_kvcache_space_gb)
    lora = engine_lora_settings(model) if args.weight_sync_lora_mode == "adapter" else None
    return ColocatedEngine(model.name_or_path, **args.engine_kwargs(max_num_seqs, lora))


def build_remote_engine(model: torch.nn.Module, args) -> RemoteEngine:
    """The collective stand-in for the server (every rank), after rank 0 found it healthy.

    Raises `ServerError` on every rank if no server answers within `vllm_server_timeout`, and `ValueError` if the
    server cannot take this run's weight updates.
    """
    from ..server.client import ServerClient

    if (
        not torch.cuda.is_available()
    ):  # trainer ranks share the cores (the engine's threads live in the server)
        torch.set_num_threads(cores_per_process(args.local_world_size))
    client = None
    if not dist.is_initialized() or dist.get_rank() == 0:
        client = ServerClient(
            args.server_url,
            request_timeout=args.vllm_server_request_timeout,
            retries=args.vllm_server_retries,
            transport=args.server_transport,
            group_port=args.vllm_group_port,
            bucket_bytes=int(min(args.vllm_server_message_mb, args.weight_sync_bucket_mb) * (1 << 20)),
        )
    engine = RemoteEngine(client)
    info = engine.wait_until_ready(args.vllm_server_timeout)
    if args.weight_sync_lora_mode == "adapter" and not info["lora"]:
        need = engine_lora_settings(model)
        raise ValueError(
            f"weight_sync_lora_mode=adapter: the server at {args.server_url} was started without LoRA; restart it "
            f"with `--max-lora-rank {need['max_rank']} --lora-target-modules {' '.join(need['target_modules'])}`, "
            "or use weight_sync_lora_mode=merged."
        )
    if args.server_transport == "nccl" and info["device"] != "cuda":
        raise ValueError(
            f"vllm_server_weight_transport=nccl: the server at {args.server_url} runs on CPU; use http."
        )
    return engine


def engine_lora_settings(model: torch.nn.Module) -> dict:
    """vLLM LoRA settings for serving `model`'s active adapter (adapter-only sync); raises before the engine is built
    if the adapter cannot be served."""
    peft_model = unwrap(model)
    if not hasattr(peft_model, "peft_config"):
        raise ValueError(
            "weight_sync_lora_mode=adapter needs a PEFT LoRA policy: set use_peft=true (or pass peft_config), or "
            "use weight_sync_lora_mode=merged."
        )
    config = peft_model.peft_config[peft_model.active_adapter]
    return serving_settings(
        config.r,
        config.target_modules,
        config.rank_pattern,
        getattr(config, "modules_to_save", None),
        getattr(config, "use_dora", False),
        getattr(config, "bias", "none"),
    )
