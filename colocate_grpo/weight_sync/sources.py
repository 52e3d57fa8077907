"""Weight sources: each yields `(engine_name, full_tensor)` pairs for the engine's `load_weights` to consume.

A source hides how the training backend stores its parameters; the sink (the colocated engine, or a server client)
only sees full tensors under checkpoint names. The source packs the tensors to send (`items.sync_items`: plain
parameters and LoRA-merged base weights) into buckets of at most `bucket_bytes` of gathered memory, gathers one
bucket at a time with the backend's collective (`gather.py`), yields its tensors and frees it before the next
bucket: the extra memory of a sync is bounded by the bucket size (or by the largest single tensor / FSDP1 unit,
whichever is larger), never the whole model.

Every rank must drain the stream completely and in the same order, even a rank that sends nothing: the gathers
are collectives. A consumer must copy each tensor before asking for the next one (the bucket it lives in is freed
when the stream moves on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Literal

import torch

from .gather import (
    fsdp1_owners,
    fsdp1_unit_bytes,
    gather_fsdp1,
    gather_fsdp2,
    gather_nothing,
    gather_zero3,
    init_fsdp1_root,
)
from .items import FullTensor, SyncItem, adapter_items, sync_items
from .shm import agree_on_shm, gather_fsdp2_shm, gather_zero3_shm, host_buffer, sharding_group, shared_bytes

WeightStream = Iterator[tuple[str, torch.Tensor]]
Backend = Literal["plain", "fsdp1", "fsdp2", "zero3"]
Bucket = tuple[Callable[[], AbstractContextManager[FullTensor]], list[SyncItem]]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / DeepSpeed engine / torch.compile wrappers, but never an FSDP1 root: its forward (used by the
    probe) is what un-shards the root's own parameters."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    while not isinstance(model, FSDP):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner
    return model


def detect_backend(model: torch.nn.Module) -> Backend:
    """How the parameters of `model` are distributed."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.tensor import DTensor

    module = unwrap(model)
    if isinstance(module, FSDP):
        return "fsdp1"
    for param in module.parameters():
        if isinstance(param, DTensor):
            return "fsdp2"
        if hasattr(param, "ds_id"):
            return "zero3"
    return "plain"


def _full_bytes(param: torch.nn.Parameter) -> int:
    numel = getattr(param, "ds_numel", None) or param.numel()  # ZeRO-3 params are empty outside a gather
    return numel * param.element_size()


Resources = Callable[[SyncItem], dict[int, int]]
"""What gathering an item costs: `{resource id: bytes}` (a parameter, or an FSDP1 unit); shared ones count once."""


def _pack(items: Sequence[SyncItem], resources: Resources, cap: int) -> list[list[SyncItem]]:
    """Greedy packing in order: a bucket grows while the bytes of its distinct resources stay within `cap` (at
    least one item per bucket). Linear in the number of items."""
    buckets: list[list[SyncItem]] = []
    current: list[SyncItem] = []
    held: dict[int, int] = {}
    for item in items:
        need = {k: v for k, v in resources(item).items() if k not in held}
        if current and sum(held.values()) + sum(need.values()) > cap:
            buckets.append(current)
            current, held, need = [], {}, resources(item)
        current.append(item)
        held.update(need)
    if current:
        buckets.append(current)
    return buckets


def _bucket_bytes(group: Sequence[SyncItem], resources: Resources) -> int:
    merged: dict[int, int] = {}
    for item in group:
        merged.update(resources(item))
    return sum(merged.values())


def _params_of(items: Sequence[SyncItem]) -> list[torch.nn.Parameter]:
    seen, params = set(), []
    for item in items:
        for p in item.params:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    return params


def plan_buckets(
    model: torch.nn.Module,
    bucket_bytes: int | None,
    items: list[SyncItem] | None = None,
    shm: bool = True,
) -> list[Bucket]:
    """The gather plan of one sync: `(gather_context_factory, items)` per bucket.

    Args:
        model (`torch.nn.Module`): the policy as the trainer holds it (DDP / FSDP / DeepSpeed wrapped or not).
        bucket_bytes (`int`, *optional*): cap on gathered bytes per bucket; `None` gathers one item at a time
            (the per-parameter baseline TRL uses).
        items (`list[SyncItem]`, *optional*): what to send; defaults to `sync_items(model)` (LoRA merged).
        shm (`bool`, *optional*, defaults to `True`): on one CPU host, gather FSDP2 / ZeRO-3 buckets through shared
            memory (`shm.py`) instead of gloo collectives, when all ranks agree `/dev/shm` has room.
    """
    module = unwrap(model)
    backend = detect_backend(model)
    items = sync_items(module) if items is None else items
    cap = bucket_bytes if bucket_bytes is not None else 0
    if backend == "plain":
        # Nothing to gather: a plain tensor is a view of its parameter, but a LoRA-merged one is a new copy, so
        # only merged tensors count against the cap (one bucket when nothing is merged).
        def merged_bytes(item: SyncItem) -> dict[int, int]:
            return {id(item): _full_bytes(item.params[0]) if item.lora is not None else 0}

        groups = _pack(items, merged_bytes, cap) if bucket_bytes is not None else [items]
        return [(lambda: gather_nothing(()), g) for g in groups]
    if backend == "fsdp1":
        init_fsdp1_root(module)
        owners = fsdp1_owners(module)

        def units_of(group: list[SyncItem]) -> list[torch.nn.Module]:
            units = {id(owners[id(p)]): owners[id(p)] for it in group for p in it.params}
            return list(units.values())

        def unit_bytes(item: SyncItem) -> dict[int, int]:
            return {id(u): fsdp1_unit_bytes(u) for u in units_of([item])}

        return [(lambda g=g: gather_fsdp1(units_of(g)), g) for g in _pack(items, unit_bytes, cap)]

    return _plan_sharded(items, backend, bucket_bytes, shm)


def _plan_sharded(items: list[SyncItem], backend: str, bucket_bytes: int | None, shm: bool) -> list[Bucket]:
    """FSDP2 / ZeRO-3 plan: buckets gathered through one shared-memory buffer sized for the largest (when every rank
    agrees `/dev/shm` has room), else by collectives whose transient buffers count against the cap."""
    cap = bucket_bytes if bucket_bytes is not None else 0
    shared = {id(item): {id(p): shared_bytes([p]) for p in item.params} for item in items}

    def param_bytes(item: SyncItem) -> dict[int, int]:
        return {id(p): _full_bytes(p) for p in item.params}

    def buffer_bytes(item: SyncItem) -> dict[int, int]:
        return shared[id(item)]

    sizes = [sum(buffer_bytes(item).values()) for item in items]
    bound = max([min(cap, sum(sizes))] + sizes)  # no bucket is larger than this
    if shm and bucket_bytes is not None and items and agree_on_shm(bound):
        buckets = _pack(items, buffer_bytes, cap)
        gather = gather_fsdp2_shm if backend == "fsdp2" else gather_zero3_shm
        # Sized once, up front, for the largest bucket: the buffer never grows mid-sync.
        largest = max(_bucket_bytes(group, buffer_bytes) for group in buckets)
        host_buffer(largest, sharding_group(_params_of(items)))
    else:
        gather = gather_fsdp2 if backend == "fsdp2" else gather_zero3
        # FSDP2's all-gather also holds this rank's packed send buffer (1/world of the bucket) during the call.
        overhead = 1 + 1 / torch.distributed.get_world_size() if backend == "fsdp2" else 1
        buckets = _pack(items, lambda item: {k: int(overhead * v) for k, v in param_bytes(item).items()}, cap)
    return [(lambda g=g: gather(_params_of(g)), g) for g in buckets]


def weight_source(
    model: torch.nn.Module,
    bucket_bytes: int | None = 256 << 20,
    merge_lora: bool = True,
    trainable_only: bool = False,
    shm: bool = True,
) -> WeightStream:
    """Stream the policy's full weights in the engine's naming, gathered bucket by bucket.

    Args:
        model (`torch.nn.Module`):
            The policy, plain or wrapped (DDP, FSDP1 root, FSDP2 `fully_shard`, DeepSpeed ZeRO-3 engine or module),
            with or without PEFT LoRA adapters (merged into the base weights on the fly).
        bucket_bytes (`int`, *optional*, defaults to 256 MiB):
            Most gathered bytes held at once; `None` for one item per gather.
        merge_lora (`bool`, *optional*, defaults to `True`):
            Merge LoRA adapters into the base weights; `False` streams the frozen base weights alone.
        trainable_only (`bool`, *optional*, defaults to `False`):
            Skip tensors the optimizer cannot change (frozen parameters, e.g. everything but the LoRA-targeted
            layers): for every sync after the first, which sent them once.
        shm (`bool`, *optional*, defaults to `True`):
            Allow the host-shared-memory gather on one CPU machine (see `plan_buckets`).

    Yields:
        `tuple[str, torch.Tensor]`: checkpoint name and full tensor (any shape), valid until the next item.
    """
    return _stream(_weight_plan(model, bucket_bytes, merge_lora, trainable_only, shm))


def adapter_source(
    model: torch.nn.Module, bucket_bytes: int | None = 256 << 20, shm: bool = True
) -> WeightStream:
    """Stream only the active LoRA adapter's factors (PEFT state-dict names), gathered like `weight_source`: the
    adapter-only sync moves these megabytes instead of the model."""
    return _stream(plan_buckets(model, bucket_bytes, adapter_items(unwrap(model)), shm))


def weight_buckets(
    model: torch.nn.Module,
    bucket_bytes: int | None = 256 << 20,
    merge_lora: bool = True,
    trainable_only: bool = False,
    shm: bool = True,
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`weight_source`, one bucket at a time: each list of `(name, full_tensor)` is valid until the next one is
    requested, so a sink can load a whole bucket in one call (vLLM's `load_weights` costs ~1 ms per call on CPU)."""
    for gather, group in _weight_plan(model, bucket_bytes, merge_lora, trainable_only, shm):
        with gather() as full:
            yield [(item.name, item.build(full)) for item in group]
        del full


def _weight_plan(model, bucket_bytes, merge_lora: bool, trainable_only: bool, shm: bool) -> list[Bucket]:
    items = sync_items(unwrap(model), merge_lora=merge_lora)
    if trainable_only:
        items = [item for item in items if item.trainable]
    return plan_buckets(model, bucket_bytes, items, shm)


def _stream(buckets: list[Bucket]) -> WeightStream:
    for gather, items in buckets:
        with gather() as full:
            for item in items:
                yield item.name, item.build(full)
        del full  # the bucket's memory must be free before the next bucket is gathered


def local_fraction(model: torch.nn.Module) -> float:
    """Bytes of parameters this rank holds / full bytes of the model: 1.0 unsharded, ~1/world fully sharded.

    Logged at each sync (`sync/local_param_fraction`) so a launch that silently fell back to replicated
    parameters shows up.
    """
    from torch.distributed.tensor import DTensor

    module = unwrap(model)
    backend = detect_backend(model)
    local = full = 0
    if backend == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for unit in module.modules():
            handle = getattr(unit, "_handle", None) if isinstance(unit, FSDP) else None
            if handle is not None:
                local += handle.flat_param.numel()
                full += handle.flat_param._unpadded_unsharded_size.numel()
        return local / max(full, 1)
    for param in module.parameters():
        if isinstance(param, DTensor):
            local += param.to_local().numel()
            full += param.numel()
        elif hasattr(param, "ds_id"):
            local += param.ds_tensor.numel()
            full += param.ds_numel
        else:
            local += param.numel()
            full += param.numel()
    return local / max(full, 1)
