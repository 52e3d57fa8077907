"""Make accelerate really shard on CPU: FSDP1/FSDP2 and DeepSpeed ZeRO-3 over gloo.

accelerate 1.15 builds a multi-process CPU world (`DistributedType.MULTI_CPU`, gloo) only when told the run is on
CPU, and then skips both sharding backends without a word:
- FSDP: the promotion to `DistributedType.FSDP` only happens for GPU-like distributed types, so an FSDP config on
  CPU silently trains plain DDP (every rank holds the full model).
- DeepSpeed: `ACCELERATE_USE_DEEPSPEED` is ignored when `cpu=True`, so the Trainer never builds the DeepSpeed
  engine; without `cpu=True` accelerate's CPU path reports `num_processes=1`, `process_index=0` on every rank.

`cpu_sharding_support()` finishes what accelerate skipped, right after its `AcceleratorState` is built: it sets the
distributed type to FSDP / DEEPSPEED with the plugin accelerate already parsed from the launch config, and takes
rank and world size from the live gloo process group. Nothing changes on GPU or when no sharding backend is
configured. `configure_cpu_sharding_env()` sets the environment DeepSpeed needs on CPU before it is imported.

Launch (2 CPU processes):
    accelerate launch --config_file accelerate_configs/fsdp2_cpu.yaml -m colocate_grpo --config recipe.yaml
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

ShardingBackend = Literal["fsdp", "deepspeed"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def launch_sharding_backend() -> ShardingBackend | None:
    """The sharding backend the launcher configured (accelerate exports its config as environment variables)."""
    if _flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    if _flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    return None


def configure_cpu_sharding_env() -> None:
    """Environment DeepSpeed needs on a CPU-only machine; call before `deepspeed` is imported.

    `DS_ACCELERATOR=cpu` selects DeepSpeed's CPU accelerator (it would otherwise probe for CUDA), and
    `DS_SKIP_SHM_OP=1` skips a ~100 s C++ build of a shared-memory collective that gloo does not need.
    """
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("DS_SKIP_SHM_OP", "1")


def _promote_cpu_state(state, fsdp_plugin, deepspeed_plugin) -> None:
    """Turn accelerate's MULTI_CPU state into the FSDP / DeepSpeed state its launch config asked for."""
    import torch
    import torch.distributed as dist
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if state.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.NO):
        return
    if not dist.is_initialized():
        return
    backend = launch_sharding_backend()
    if backend == "fsdp" and fsdp_plugin is not None:
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = fsdp_plugin
    elif backend == "deepspeed" and deepspeed_plugin is not None:
        plugins = deepspeed_plugin if isinstance(deepspeed_plugin, dict) else {"default": deepspeed_plugin}
        for plugin in plugins.values():
            plugin.set_mixed_precision(state._mixed_precision)
        next(iter(plugins.values())).select(_from_accelerator_state=True)
        state.distributed_type = DistributedType.DEEPSPEED
        state.deepspeed_plugins = deepspeed_plugin
        state._mixed_precision = "no"  # DeepSpeed handles precision from its own config
    else:
        return
    # Rank and world come from the live process group: accelerate's CPU path may have read them from MPI-style
    # variables that torchrun / accelerate launch do not set.
    fixed = {
        "distributed_type": state.distributed_type,
        "num_processes": dist.get_world_size(),
        "process_index": dist.get_rank(),
        "local_process_index": int(os.environ.get("LOCAL_RANK", dist.get_rank())),
        # accelerate says `cpu:0` on every rank; FSDP1 compares its compute device (`cpu`) with it and refuses.
        "device": torch.device("cpu"),
    }
    # Every later `AcceleratorState()` re-copies PartialState's shared fields over its own: fix both.
    PartialState._shared_state.update(fixed)
    for key, value in fixed.items():
        setattr(state, key, value)


@contextmanager
def cpu_sharding_support() -> Iterator[None]:
    """While active, every `AcceleratorState` built on a CPU-only machine gets the sharding backend its launch
    configured. Wrap the construction of the `Accelerator` (the Trainer's `create_accelerator_and_postprocess`)."""
    import torch

    if torch.cuda.is_available() or launch_sharding_backend() is None:
        yield
        return
    from accelerate import state as state_module

    original = state_module.AcceleratorState.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _promote_cpu_state(self, kwargs.get("fsdp_plugin"), kwargs.get("deepspeed_plugin"))

    state_module.AcceleratorState.__init__ = init
    try:
        yield
    finally:
        state_module.AcceleratorState.__init__ = original


def fix_cpu_accelerator(accelerator) -> None:
    """Per-accelerator CPU fixes, after it is built; a no-op on GPU and for other backends.

    FSDP1: `Accelerator.get_state_dict` (what the Trainer saves) hard-codes `FullStateDictConfig(offload_to_cpu=True)`,
    and "offloading" tensors that already live on the CPU makes FSDP1 free their storage: the process dies with
    SIGSEGV while writing the checkpoint. On CPU the full state dict is gathered without offload.
    """
    import torch
    from accelerate.utils import DistributedType

    if (
        torch.cuda.is_available()
        or accelerator.distributed_type != DistributedType.FSDP
        or accelerator.is_fsdp2
    ):
        return
    original = accelerator.get_state_dict

    def get_state_dict(model, unwrap: bool = True):
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        if not isinstance(model, FSDP):
            return original(model, unwrap)
        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            return model.state_dict()

    accelerator.get_state_dict = get_state_dict
