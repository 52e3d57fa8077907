"""In-memory LoRA adapters for the colocated engine: vLLM's LoRA manager fed from tensors, never from disk.

Part of the engine's vLLM seam (with `colocated.py`): a vLLM upgrade that moves the LoRA manager touches this file.
"""

from __future__ import annotations

import torch

LORA_ID = 1  # one adapter id, ever: another id could evict ours, and its reload would look for the fake path


# The adapter ranks vLLM accepts as `max_lora_rank`.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def serving_settings(
    r: int,
    target_modules,
    rank_pattern: dict | None = None,
    modules_to_save=None,
    use_dora: bool = False,
    bias: str = "none",
) -> dict:
    """Whether vLLM can serve a LoRA adapter of this shape (adapter-only sync), and the engine settings for it.

    The one place that knows vLLM's LoRA limits: the CLI calls it on the recipe's `lora_*` options at parse time,
    the trainer on the PEFT config before the engine is built. `target_modules=None` (PEFT's per-model default, not
    known before the model loads) passes here and is checked on the PEFT config.

    Returns:
        `dict`: `{"max_rank": int, "target_modules": list[str] | None}` (`ColocatedEngine(lora=...)`).

    Raises:
        `ValueError` naming the option and the fix.
    """
    if modules_to_save:
        raise ValueError(
            f"weight_sync_lora_mode=adapter: vLLM cannot serve modules_to_save={modules_to_save}; use "
            "weight_sync_lora_mode=merged, or drop lora_modules_to_save."
        )
    if use_dora or (bias or "none") != "none":
        raise ValueError(
            "weight_sync_lora_mode=adapter: vLLM serves neither DoRA (use_dora) nor LoRA biases; use "
            "weight_sync_lora_mode=merged."
        )
    rank = max(r, *rank_pattern.values()) if rank_pattern else r
    max_rank = next((v for v in VLLM_LORA_RANKS if v >= rank), None)
    if max_rank is None:
        raise ValueError(
            f"weight_sync_lora_mode=adapter: lora_r={rank} exceeds vLLM's largest LoRA rank 512."
        )
    if isinstance(target_modules, str):
        raise ValueError(
            "weight_sync_lora_mode=adapter needs lora_target_modules as a list of module names (not a regex or "
            f"{target_modules!r}); or use weight_sync_lora_mode=merged."
        )
    return {
        "max_rank": max_rank,
        "target_modules": None if target_modules is None else sorted(target_modules),
    }


def engine_args(lora: dict | None) -> dict:
    """`vllm.LLM` arguments for serving one in-memory adapter (`{"max_rank": int, "target_modules": [...]}`)."""
    if lora is None:
        return {}
    return {
        "enable_lora": True,
        "max_lora_rank": lora["max_rank"],
        # Two slots although one adapter is served: vLLM-CPU's LoRA ops index "no adapter" as slot -1, i.e.
        # the last slot, which must stay empty (zeros) for base requests batched with LoRA ones.
        "max_loras": 2,
        # Only the projection layers: vLLM-CPU's lm_head LoRA wrapper breaks batched prompt logprobs.
        "lora_target_modules": list(lora["target_modules"]),
    }


def install_adapter(runner, tensors: dict[str, torch.Tensor], peft_config: dict, device: str):
    """Register `tensors` as the served adapter in the worker's LoRA manager (replacing the previous version).

    Args:
        runner: the vLLM model runner of this rank (`ColocatedEngine._runner`).
        tensors (`dict[str, torch.Tensor]`): full LoRA factors in PEFT state-dict naming, shapes `[r, in]` / `[out, r]`.
        peft_config (`dict`): the adapter's `LoraConfig.to_dict()`.
        device (`str`): `"cpu"` or `"cuda"`.

    Returns:
        `tuple[LoRARequest, int]`: the request to pass with every generation, and the bytes loaded.
    """
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.request import LoRARequest

    worker_manager = runner.lora_manager
    manager = worker_manager._adapter_manager
    config = dict(peft_config)
    if isinstance(config.get("target_modules"), set):
        config["target_modules"] = sorted(config["target_modules"])
    config["vllm_max_position_embeddings"] = worker_manager.max_position_embeddings
    helper = PEFTHelper.from_dict(config)
    helper.validate_legal(worker_manager.lora_config)
    mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
    # Copies, not references: vLLM scales lora_B in place (`lora_b *= alpha / r`) when it optimises an adapter,
    # which would silently rescale the trainer's own parameters.
    owned = {k: v.detach().to(device).clone() for k, v in tensors.items()}
    adapter = LoRAModel.from_lora_tensors(
        lora_model_id=LORA_ID,
        tensors=owned,
        peft_helper=helper,
        device=device,
        dtype=worker_manager.lora_config.lora_dtype,
        model_vocab_size=worker_manager.vocab_size,
        weights_mapper=mapper.get_rename_mapper() if mapper is not None else None,
        skip_prefixes=getattr(manager.model, "lora_skip_prefixes", None),
    )
    manager._validate_modules_to_save(adapter)
    manager.remove_adapter(LORA_ID)  # frees the slot and unregisters the previous version
    manager.add_adapter(adapter)
    manager.activate_adapter(LORA_ID)  # copies the factors into the layers' slot buffers
    # The request's path is never read: the worker finds the id registered and active.
    request = LoRARequest("policy", LORA_ID, "in-memory://policy")
    return request, sum(t.numel() * t.element_size() for t in owned.values())
