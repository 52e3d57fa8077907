"""Weight sources: each yields `(engine_name, full_tensor)` pairs for the engine's `load_weights` to consume.

A source hides how the training backend stores its parameters; the sink (the colocated engine, or a server client)
only sees full tensors under checkpoint names. Sharded (FSDP1/FSDP2/ZeRO-3) and adapter (PEFT) sources plug in here
with the same signature; gathering collectives live inside the source, and every rank must drain the iterator in
the same order so that the collectives line up.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .names import is_adapter_only, to_engine_name

WeightStream = Iterator[tuple[str, torch.Tensor]]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """Strip DDP / torch.compile wrappers (the objects, not just the names)."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def plain_source(model: torch.nn.Module) -> WeightStream:
    """Full parameters of an unsharded model (single process or DDP, where every rank holds a full replica).

    Tied parameters (e.g. `lm_head.weight` tied to `model.embed_tokens.weight`) are yielded once under their first
    name, which is the one vLLM loads for tied models. No collective is involved.

    Args:
        model (`torch.nn.Module`): the policy, possibly DDP-wrapped.

    Yields:
        `tuple[str, torch.Tensor]`: checkpoint name and the parameter's data, detached, any shape.
    """
    for name, param in unwrap(model).named_parameters():
        yield to_engine_name(name), param.detach()


def _is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "merge_adapter") and hasattr(model, "peft_config")


def peft_merged_source(model: torch.nn.Module) -> WeightStream:
    """Base weights of an unsharded PEFT model with its adapters merged in (merge-then-sync).

    The adapters are merged before the first tensor is yielded and unmerged once the stream is drained (or closed),
    so the training model is back to base + adapter for the next step. LoRA factors are not sent: the engine holds
    a plain base model.

    Yields:
        `tuple[str, torch.Tensor]`: checkpoint name and merged weight, any shape.
    """
    peft_model = unwrap(model)
    with torch.no_grad():
        peft_model.merge_adapter()
    try:
        for name, param in peft_model.named_parameters():
            if not is_adapter_only(name):
                yield to_engine_name(name), param.detach()
    finally:
        with torch.no_grad():
            peft_model.unmerge_adapter()


def weight_source(model: torch.nn.Module) -> WeightStream:
    """Pick the source matching how `model` is distributed and adapted."""
    if _is_peft(unwrap(model)):
        return peft_merged_source(model)
    return plain_source(model)
