"""Parameter-name normalisation: every wrapper prefix a training backend adds, stripped in one place.

vLLM's `load_weights` expects the names of the HF checkpoint (`model.layers.0.self_attn.q_proj.weight`).
DDP, torch.compile, activation checkpointing and FSDP insert their own module levels into `named_parameters()`.
"""

from __future__ import annotations

_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")
_LEADING = ("module.",)


def to_engine_name(name: str) -> str:
    """Map a training-side parameter name to the checkpoint name vLLM loads.

    Example: `module._fsdp_wrapped_module.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight`
    -> `model.layers.0.mlp.up_proj.weight`.
    """
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    for lead in _LEADING:
        name = name.removeprefix(lead)
    return name
