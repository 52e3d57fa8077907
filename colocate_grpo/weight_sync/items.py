"""What one sync sends: a list of `SyncItem`s, each the parameters to gather and how to turn them into one tensor.

A plain parameter is sent as is. A PEFT LoRA layer's frozen base weight is sent merged with its adapters,
`W + sum_a scaling_a * B_a @ A_a`, computed out of place from the gathered tensors: the training model is never
modified, so there is no merge/unmerge rounding drift in the frozen base weights, and the merge needs only that
layer's tensors gathered (never the whole model at once under ZeRO-3 / FSDP). LoRA factors and PEFT's frozen
`original_module` copies are never sent: the engine holds a plain base model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .names import is_adapter_only, strip_wrappers, to_engine_name

FullTensor = Callable[[torch.nn.Parameter], torch.Tensor]
"""Maps a parameter to its full (gathered) tensor inside a gather context."""


@dataclass
class SyncItem:
    """One tensor the engine receives.

    Attributes:
        name (`str`): checkpoint name in the engine (`model.layers.0.mlp.up_proj.weight`).
        params (`tuple[torch.nn.Parameter, ...]`): parameters that must be gathered to build it.
        lora (`torch.nn.Module`, *optional*): the PEFT LoRA layer whose active adapters are merged into `params[0]`.
    """

    name: str
    params: tuple[torch.nn.Parameter, ...]
    lora: torch.nn.Module | None = None

    @property
    def trainable(self) -> bool:
        """Whether the optimizer can change this tensor (frozen tensors need to reach the engine only once)."""
        return any(p.requires_grad for p in self.params)

    @torch.no_grad()
    def build(self, full: FullTensor) -> torch.Tensor:
        """The tensor to send, from the gathered parameters; same shape as the checkpoint tensor."""
        base = full(self.params[0]).detach()
        if self.lora is None:
            return base
        merged = base.clone()
        layer = self.lora
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            a = full(layer.lora_A[adapter].weight).to(torch.float32)
            b = full(layer.lora_B[adapter].weight).to(torch.float32)
            delta = (b @ a) * layer.scaling[adapter]
            merged += (delta.T if layer.fan_in_fan_out else delta).to(merged.dtype)
        return merged


def _lora_layers(module: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """PEFT LoRA layers by module path; raises for LoRA variants that merge-then-sync cannot express."""
    layers = {}
    for path, sub in module.named_modules():
        if not (hasattr(sub, "base_layer") and hasattr(sub, "lora_A")):
            continue
        if getattr(sub, "lora_embedding_A", None):
            raise NotImplementedError(
                f"{path}: LoRA on embedding layers is not supported by the weight sync; remove embed_tokens from "
                "lora_target_modules (or list it in modules_to_save)."
            )
        if any(getattr(sub, "use_dora", {}).values()):
            raise NotImplementedError(
                f"{path}: DoRA adapters are not supported by the weight sync; set use_dora=false."
            )
        if getattr(sub, "merged", False):
            raise RuntimeError(
                f"{path}: adapters are already merged into the base weights; unmerge before syncing."
            )
        layers[path] = sub
    return layers


def sync_items(module: torch.nn.Module, merge_lora: bool = True) -> list[SyncItem]:
    """Every tensor the engine needs, in `named_parameters()` order (identical on every rank).

    Tied parameters appear once, under their first name (the one vLLM loads for tied embeddings).

    Args:
        module (`torch.nn.Module`): the unwrapped policy (FSDP1 root wrappers are fine: names are normalised).
        merge_lora (`bool`, *optional*, defaults to `True`): merge LoRA adapters into their base weights; `False`
            sends the frozen base weights alone (adapter-only sync sends the factors separately).
    """
    layers = _lora_layers(module) if merge_lora else {}
    items = []
    for name, param in module.named_parameters():
        if is_adapter_only(name):
            continue
        owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
        lora = layers.get(owner) if owner is not None and name.endswith(".base_layer.weight") else None
        params = (param,)
        if lora is not None:
            for adapter in lora.active_adapters:
                if adapter in lora.lora_A:
                    params += (lora.lora_A[adapter].weight, lora.lora_B[adapter].weight)
        items.append(SyncItem(to_engine_name(name), params, lora))
    return items


def adapter_items(module: torch.nn.Module) -> list[SyncItem]:
    """The active adapter's LoRA factors under PEFT state-dict names (what `get_peft_model_state_dict` returns and
    vLLM's LoRA loader expects): `base_model.model.<layer>.lora_A.weight`, shape `[r, in]`; `lora_B`: `[out, r]`."""
    items = []
    for path, layer in _lora_layers(module).items():
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            for kind in ("lora_A", "lora_B"):
                name = strip_wrappers(f"{path}.{kind}.weight")
                items.append(SyncItem(name, (getattr(layer, kind)[adapter].weight,)))
    return items
