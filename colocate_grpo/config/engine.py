"""Engine dtypes the model or the device cannot run, rejected before anything loads (the CLI calls this with the
checkpoint's model type and the GPU's compute capability)."""

from __future__ import annotations

# vLLM refuses float16 for these model types (numerical instability; vllm/config/model.py).
FLOAT16_UNSUPPORTED = ("gemma2", "gemma3", "gemma3_text", "glm4")


def check_engine_dtype(
    vllm_dtype: str | None, model_type: str | None, cuda_capability: tuple[int, int] | None
) -> None:
    """Reject an engine dtype the model or the device cannot run, before anything loads.

    Args:
        vllm_dtype (`str`, *optional*): the recipe's `vllm_dtype` (`None`: the per-host default).
        model_type (`str`, *optional*): `model_type` of the checkpoint's config, if known.
        cuda_capability (`tuple[int, int]`, *optional*): the GPU's compute capability; `None` on CPU.
    """
    if vllm_dtype == "float16" and model_type in FLOAT16_UNSUPPORTED:
        raise ValueError(
            f"vllm_dtype=float16: vLLM cannot run {model_type} models in float16 (numerical instability); use "
            "vllm_dtype: bfloat16 (or float32, or leave it unset)."
        )
    if vllm_dtype == "bfloat16" and cuda_capability is not None and cuda_capability < (8, 0):
        major, minor = cuda_capability
        raise ValueError(
            f"vllm_dtype=bfloat16: this GPU (compute capability {major}.{minor}) has no bfloat16 support; use "
            "vllm_dtype: float16 or float32."
        )
