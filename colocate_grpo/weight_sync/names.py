"""Parameter-name normalisation: every wrapper prefix a training backend adds, stripped in one place.

vLLM's `load_weights` expects the names of the HF checkpoint (`model.layers.0.self_attn.q_proj.weight`).
DDP, torch.compile, activation checkpointing, FSDP and PEFT insert their own module levels into
`named_parameters()`; adapter tensors themselves (`lora_A`/`lora_B`) have no counterpart in the engine.
"""

from __future__ import annotations

_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
# PEFT: the wrapped original layer, and the trained copy of a `modules_to_save` module (which replaces the original).
_PEFT_PARTS = (".base_layer", "modules_to_save.default.")
_ADAPTER_MARKERS = ("lora_", ".original_module.")


def strip_wrappers(name: str) -> str:
    """Remove DDP / FSDP / activation-checkpointing / torch.compile levels, keeping PEFT's own naming.

    Example: `module._fsdp_wrapped_module.base_model.model.model.layers.0.mlp.up_proj.lora_A.weight`
    -> `base_model.model.model.layers.0.mlp.up_proj.lora_A.weight` (a PEFT state-dict name).
    """
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name.removeprefix("module.")


def to_engine_name(name: str) -> str:
    """Map a training-side parameter name to the checkpoint name vLLM loads.

    Example: `module._fsdp_wrapped_module.base_model.model.model.layers.0.mlp.up_proj.base_layer.weight`
    -> `model.layers.0.mlp.up_proj.weight`.
    """
    name = strip_wrappers(name).removeprefix("base_model.model.")
    for part in _PEFT_PARTS:
        name = name.replace(part, "")
    return name


def is_adapter_only(name: str) -> bool:
    """True for PEFT-only tensors (LoRA factors, the frozen original of a `modules_to_save` module)."""
    return any(marker in name for marker in _ADAPTER_MARKERS)
