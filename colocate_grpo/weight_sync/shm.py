"""Gathering through host shared memory: the fast path when every rank of the training world is on one CPU machine.

Every colocated engine needs the full weights, so a sharded sync must move each rank's shard to every other rank.
Over gloo that goes through loopback TCP (about 0.6 GB/s here); through one shared buffer it is a memory copy: each
rank writes its own shard of the bucket into its slot of a `/dev/shm` mapping, the ranks meet at a barrier, and
every rank reads the full tensors in place, as views of the buffer (no receive copies at all). A second barrier
keeps any rank from overwriting the buffer for the next bucket while another still reads the current one.

Layout: a parameter of the bucket owns a region of `world * shard_bytes`; rank `r` writes its padded shard at
`r * shard_bytes`. Because both FSDP2 (dim 0, `torch.chunk`) and ZeRO-3 (flattened, equal partitions) give rank `r`
the `r`-th contiguous piece of the parameter, padding only at the end, the region's first `numel` elements ARE
the full parameter, in order.

The mapping's file is unlinked as soon as every rank has mapped it, so nothing is left in `/dev/shm`, even after a
crash. The buffer (one per host, shared by its ranks, at most the largest bucket) stays mapped between syncs.
Used only on CPU, on one host, when `/dev/shm` has room; otherwise the sources use collectives.
"""

from __future__ import annotations

import math
import os
import socket
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from .items import FullTensor

_SHM_DIR = "/dev/shm"
# One mapping per process group, the size of the largest bucket so far, kept between syncs: every sync gathers the
# same buckets, and fresh tmpfs pages cost more to fault in than the copy itself (0.16 s vs ~1 s per SmolLM2 sync).
_buffers: dict[tuple[int, ...], torch.Tensor] = {}


def release_host_buffers() -> None:
    """Unmap the shared buffers (they are re-created, collectively, by the next sync that needs one)."""
    _buffers.clear()


def shm_available(nbytes: int) -> bool:
    """True when this rank runs on CPU and `/dev/shm` can hold `nbytes` more (see `agree_on_shm` for the host)."""
    if not dist.is_initialized() or torch.cuda.is_available() or not os.path.isdir(_SHM_DIR):
        return False
    stats = os.statvfs(_SHM_DIR)
    return stats.f_bavail * stats.f_frsize > 2 * nbytes


def sharding_group(params: Sequence[torch.nn.Parameter]) -> dist.ProcessGroup | None:
    """The process group the parameters are sharded over (FSDP2 mesh / ZeRO-3 partition group; None = world)."""
    for p in params:
        if hasattr(p, "device_mesh"):
            return p.device_mesh.get_group()
        if getattr(p, "ds_tensor", None) is not None:
            return getattr(p, "ds_process_group", None)
    return None


def host_buffer(nbytes: int, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """A byte tensor of at least `nbytes` mapped by every rank of `group` (collective when it must grow). Sources
    reserve the largest bucket before the first gather, so it grows at most once per sync plan, never mid-sync."""
    # Keyed by member ranks: the same group can come back as different Python objects (e.g. DeviceMesh.get_group()).
    key = tuple(dist.get_process_group_ranks(group)) if group is not None else ()
    buffer = _buffers.get(key)
    if buffer is not None and buffer.numel() >= nbytes:
        return buffer
    _buffers.pop(key, None)  # unmapped before the larger one is made: never both at once
    buffer = None
    path = [None]
    if dist.get_rank(group) == 0:
        fd, path[0] = tempfile.mkstemp(prefix="colocate_grpo_sync_", dir=_SHM_DIR)
        os.ftruncate(fd, nbytes)
        os.close(fd)
    dist.broadcast_object_list(path, src=dist.get_global_rank(group, 0) if group else 0, group=group)
    buffer = torch.from_file(path[0], shared=True, size=nbytes, dtype=torch.uint8)
    dist.barrier(group=group)  # everyone has mapped it: the name can go
    if dist.get_rank(group) == 0:
        os.unlink(path[0])
    _buffers[key] = buffer
    return buffer


def _fsdp2_layout(p) -> tuple[torch.Tensor, int, int]:
    """(local shard, shard bytes per rank, elements of the full parameter) of a dim-0-sharded DTensor."""
    world = p.device_mesh.size()
    rows = p.shape[0]
    shard = math.ceil(rows / world) * (p.numel() // max(rows, 1))
    return p.to_local().detach(), shard * p.element_size(), p.numel()


def _zero3_layout(p) -> tuple[torch.Tensor, int, int]:
    """(local partition, partition bytes per rank, elements of the full parameter) of a ZeRO-3 parameter. The
    partition (`ds_tensor`) is what the optimizer updates, so it is current even for a parameter that happens to be
    gathered at the moment."""
    local = p.ds_tensor.detach()
    return local, local.numel() * local.element_size(), p.ds_numel


def shared_bytes(params: Sequence[torch.nn.Parameter]) -> int:
    """Buffer bytes a bucket of these parameters takes (full sizes plus each rank's shard padding)."""
    from .gather import _is_row_sharded

    total = 0
    for p in params:
        if _is_row_sharded(p):
            total += p.device_mesh.size() * _fsdp2_layout(p)[1]
        elif getattr(p, "ds_tensor", None) is not None:
            total += dist.get_world_size(getattr(p, "ds_process_group", None)) * _zero3_layout(p)[1]
    return total


@contextmanager
def _gather_shared(params: Sequence[torch.nn.Parameter], layout, shape, group) -> Iterator[FullTensor]:
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    where, offset = {}, 0
    for p in params:
        local, shard_bytes, numel = layout(p)
        where[id(p)] = (offset, local, shard_bytes, numel)
        offset += world * shard_bytes
    buffer = host_buffer(offset, group)
    for start, local, shard_bytes, _ in where.values():  # this rank's piece of every parameter
        slot = buffer[
            start + rank * shard_bytes : start + rank * shard_bytes + local.numel() * local.element_size()
        ]
        slot.copy_(local.reshape(-1).view(torch.uint8))
    dist.barrier(group=group)  # every shard is written

    def full(p: torch.nn.Parameter) -> torch.Tensor:
        start, local, _, numel = where[id(p)]
        flat = buffer[start : start + numel * local.element_size()].view(local.dtype)
        return flat.view(shape(p))

    try:
        yield full
    finally:
        dist.barrier(group=group)  # every rank is done reading before the buffer is reused


@contextmanager
def gather_fsdp2_shm(params: Sequence[torch.nn.Parameter]) -> Iterator[FullTensor]:
    """FSDP2 dim-0-sharded DTensors on a 1-D mesh through host shared memory; any other parameter is gathered with
    `full_tensor()` (DTensor) or read as it is."""
    from torch.distributed.tensor import DTensor

    from .gather import _is_row_sharded

    sharded = [p for p in params if _is_row_sharded(p) and p.device_mesh.ndim == 1]
    group = sharded[0].device_mesh.get_group() if sharded else None
    with _gather_shared(sharded, _fsdp2_layout, lambda p: p.shape, group) as full:
        done = {id(p) for p in sharded}
        yield (
            lambda p: (
                full(p) if id(p) in done else (p.full_tensor() if isinstance(p, DTensor) else p.detach())
            )
        )


@contextmanager
def gather_zero3_shm(params: Sequence[torch.nn.Parameter]) -> Iterator[FullTensor]:
    """DeepSpeed ZeRO-3 partitions through host shared memory (parameters without a partition are read as they
    are)."""
    partitioned = [p for p in params if getattr(p, "ds_tensor", None) is not None]
    group = getattr(partitioned[0], "ds_process_group", None) if partitioned else None
    with _gather_shared(partitioned, _zero3_layout, lambda p: p.ds_shape, group) as full:
        yield lambda p: full(p) if getattr(p, "ds_tensor", None) is not None else p.data


def agree_on_shm(nbytes: int) -> bool:
    """Whether every rank can use the shared buffer: all on this host (hostnames compared: launchers' and vLLM's
    LOCAL_WORLD_SIZE cannot be trusted for this) and all with room in `/dev/shm`. Collective, so that all ranks take
    the same path."""
    if not dist.is_initialized() or torch.cuda.is_available():
        return False
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, (socket.gethostname(), shm_available(nbytes)))
    return all(ok for _, ok in views) and len({host for host, _ in views}) == 1
