"""Gathering sharded parameters, one bucket at a time: a context manager per backend.

Each `gather_*(params)` enters with a function mapping every parameter of the bucket to its full tensor, and frees
the gathered memory on exit. All of them are collectives over the training world: every rank must gather the same
buckets in the same order (the sources guarantee it by building buckets from `named_parameters()` order, which
is identical on every rank), or the ranks deadlock or exchange the wrong tensors.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch
import torch.distributed as dist

from .items import FullTensor


@contextmanager
def gather_nothing(params: Sequence[torch.nn.Parameter]) -> Iterator[FullTensor]:
    """Unsharded parameters (single process, DDP, ZeRO-1/2): every rank already holds them."""
    yield lambda p: p.detach()


@contextmanager
def gather_zero3(params: Sequence[torch.nn.Parameter]) -> Iterator[FullTensor]:
    """DeepSpeed ZeRO-3: one coalesced all-gather for the whole bucket (`GatheredParameters` over a list), released
    (re-partitioned, without write-back) on exit."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(params), modifier_rank=None):
        yield lambda p: p.data


def _is_row_sharded(param: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor, Shard

    return (
        isinstance(param, DTensor)
        and len(param.placements) == 1
        and isinstance(param.placements[0], Shard)
        and param.placements[0].dim == 0
    )


@contextmanager
def gather_fsdp2(params: Sequence[torch.nn.Parameter]) -> Iterator[FullTensor]:
    """FSDP2: all-gather every dim-0-sharded DTensor of the bucket in ONE collective (bytes of all shards packed
    into one buffer), instead of one `full_tensor()` collective per parameter.

    FSDP2 shards dim 0 like `torch.chunk`: rank `r` holds rows `[r*c, min((r+1)*c, n))` with `c = ceil(n / W)`, so
    each rank pads its rows to `c`, and the concatenation of all padded chunks cut at `n` rows is the full tensor.
    Other placements (e.g. HSDP meshes) fall back to `full_tensor()`.
    """
    from torch.distributed.tensor import DTensor

    sharded = [p for p in params if _is_row_sharded(p)]
    table, where = None, {}
    if sharded:
        group = sharded[0].device_mesh.get_group()
        world = dist.get_world_size(group)
        offset = 0
        for p in sharded:
            padded_rows = math.ceil(p.shape[0] / world)
            where[id(p)] = (offset, padded_rows * (p.numel() // max(p.shape[0], 1)) * p.element_size())
            offset += where[id(p)][1]
        send = torch.zeros(offset, dtype=torch.uint8, device=sharded[0].to_local().device)
        for p in sharded:  # this rank's rows of every parameter, packed as bytes (the zero tail is padding)
            start = where[id(p)][0]
            local = p.to_local().detach().reshape(-1).view(torch.uint8)
            send[start : start + local.numel()].copy_(local)
        recv = send.new_empty(world * send.numel())
        dist.all_gather_into_tensor(recv, send, group=group)
        del send
        table = recv.view(world, -1)  # row r: rank r's padded chunks of every parameter, back to back
        del recv

    def full(p: torch.nn.Parameter) -> torch.Tensor:
        # Built on request, one parameter at a time, so the bucket's memory is the receive buffer plus one tensor.
        if id(p) in where:
            start, nbytes = where[id(p)]
            rank_chunks = table[:, start : start + nbytes].contiguous().view(p.dtype)
            return rank_chunks.reshape(-1, *p.shape[1:])[: p.shape[0]]
        return p.full_tensor() if isinstance(p, DTensor) else p.detach()

    try:
        yield full
    finally:
        table = None  # frees the receive buffer before the next bucket is gathered  # noqa: F841


@contextmanager
def gather_fsdp1(units: Sequence[torch.nn.Module]) -> Iterator[FullTensor]:
    """FSDP1: un-shard the given FSDP units (each with `recurse=False`, i.e. only its own flat parameter;
    `writeback=False`, nothing is written back). Inside, the original parameters (`use_orig_params=True`) are full.
    The FSDP unit is FSDP1's smallest all-gather, so it bounds a bucket from below."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with ExitStack() as stack:
        for unit in units:
            stack.enter_context(FSDP.summon_full_params(unit, recurse=False, writeback=False))
        yield lambda p: p.detach()


def fsdp1_unit_bytes(unit: torch.nn.Module) -> int:
    """Full (un-sharded) bytes of the parameters an FSDP1 unit owns directly (not those of nested units)."""
    handle = getattr(unit, "_handle", None)  # torch-internal: FSDP1's FlatParamHandle
    if handle is None:
        return 0
    flat = handle.flat_param
    return flat._unpadded_unsharded_size.numel() * flat.element_size()


def fsdp1_owners(root: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Map `id(param)` -> the FSDP1 unit that owns it (the innermost FSDP module above it)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    owners: dict[int, torch.nn.Module] = {}
    for unit in reversed([m for m in root.modules() if isinstance(m, FSDP)]):  # innermost first
        for param in unit.parameters():
            owners.setdefault(id(param), unit)
    return owners


def init_fsdp1_root(root: torch.nn.Module) -> None:
    """FSDP1 builds its root state lazily at the first forward; un-sharding a nested unit before that fails, so
    enter (and leave) the root's own un-shard once. Collective: every rank calls it at the same point."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if getattr(root, "_is_root", None) is None:
        with FSDP.summon_full_params(root, recurse=False, writeback=False):
            pass
