"""Every TRL internal we depend on that may move between versions (pinned: trl 1.16.x), in one place.

vLLM internals live in `colocate_grpo.engine.colocated`; this file only covers the trainer side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trl.trainer.grpo_trainer as _grpo_module
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

# Also version-dependent, and overridden by `ColocateGRPOTrainer`: the signature of
# `GRPOTrainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, batch_size,
# compute_entropy, compute_aux_loss, **multimodal) -> (logps, entropies, aux_loss)` (TRL 1.16).
__all__ = ["entropy_from_logits", "generation_backend", "metrics_store", "selective_log_softmax"]


@contextmanager
def generation_backend(factory: Callable[..., object]) -> Iterator[None]:
    """Make `GRPOTrainer.__init__` build its generation backend with `factory` instead of TRL's `VLLMGeneration`.

    TRL 1.16 constructs `VLLMGeneration(model=..., accelerator=..., processing_class=..., max_num_seqs=..., ...)`
    when `use_vllm=True`; the trainer then only calls `sync_weights()`, `generate(...)` and reads `.llm` on it.
    Swapping the constructor for the duration of `__init__` keeps TRL's wiring of the sampling arguments and avoids
    building a second engine.
    """
    original = _grpo_module.VLLMGeneration
    _grpo_module.VLLMGeneration = factory
    try:
        yield
    finally:
        _grpo_module.VLLMGeneration = original


def metrics_store(trainer) -> dict:
    """TRL's per-mode metric lists (`trainer._metrics["train"][name] -> list[float]`), averaged at each log."""
    return trainer._metrics
