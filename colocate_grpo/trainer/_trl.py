"""Every TRL internal we depend on that may move between versions (pinned: trl 1.16.x), in one place.

Nothing else in the package reaches into TRL's privates or its module globals; vLLM internals live in
`colocate_grpo.engine`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import trl
import trl.trainer.grpo_trainer as _grpo_module
from trl.trainer.utils import entropy_from_logits, selective_log_softmax

__all__ = [
    "BACKEND_OPTIONS",
    "OVERRIDDEN_HOOKS",
    "SUPPORTED_TRL",
    "check_hooks",
    "entropy_from_logits",
    "generation_backend",
    "llm_view",
    "metrics_store",
    "selective_log_softmax",
    "tokenizer_of",
]
SUPPORTED_TRL = "1.16.x"

# Every keyword TRL 1.16 passes to `VLLMGeneration`, each honoured from the `ColocateGRPOConfig` fields it comes
# from (`trainer.generation.build_generation`) or rejected at parse time (`vllm_structured_outputs_regex`):
# a keyword outside this set fails `generation_backend` loudly instead of being dropped.
BACKEND_OPTIONS = frozenset(
    {
        "model", "accelerator", "processing_class", "mode", "structured_outputs_regex", "server_base_url",
        "server_host", "server_port", "group_port", "server_timeout", "tensor_parallel_size",
        "gpu_memory_utilization", "max_model_length", "max_num_seqs", "enable_sleep_mode", "model_impl",
        "trust_remote_code", "repetition_penalty", "temperature", "top_p", "top_k", "min_p", "max_completion_length",
        "logprobs", "generation_kwargs",
    }
)  # fmt: skip


@contextmanager
def generation_backend(factory: Callable[..., object]) -> Iterator[None]:
    """Make `GRPOTrainer.__init__` build its generation backend with `factory` instead of TRL's `VLLMGeneration`.

    TRL 1.16 constructs `VLLMGeneration(model=..., accelerator=..., processing_class=..., max_num_seqs=..., ...)`
    when `use_vllm=True`; the trainer then only calls `sync_weights()`, `generate(...)`, and reads `.llm` (tool
    loops) and `.vllm_client` (server mode) on it. Swapping the constructor for the duration of `__init__` keeps
    TRL's wiring of the sampling arguments and avoids building a second engine.

    Raises:
        `RuntimeError`: when `__init__` returned without calling `factory` (a TRL release that builds its backend
            another way would otherwise train with TRL's own engine and no verified sync).
    """
    calls = []

    def recorded(**kwargs):
        unknown = set(kwargs) - BACKEND_OPTIONS
        if unknown:
            raise RuntimeError(
                f"trl {trl.__version__} passes generation-backend options colocate_grpo does not know: "
                f"{sorted(unknown)}; they would be silently ignored. Use trl {SUPPORTED_TRL} or teach "
                "colocate_grpo.trainer._trl.BACKEND_OPTIONS (and the engine) what they mean."
            )
        calls.append(sorted(kwargs))
        return factory(**kwargs)

    original = _grpo_module.VLLMGeneration
    _grpo_module.VLLMGeneration = recorded
    try:
        yield
    finally:
        _grpo_module.VLLMGeneration = original
    if not calls:
        raise RuntimeError(
            f"trl {trl.__version__}: GRPOTrainer.__init__ no longer builds its generation backend through "
            "trl.trainer.grpo_trainer.VLLMGeneration, so ColocateGRPOTrainer could not install its engine; use the "
            f"TRL release colocate_grpo supports ({SUPPORTED_TRL}) or update colocate_grpo.trainer._trl."
        )


# The GRPOTrainer methods `ColocateGRPOTrainer` (grpo.py, rewards.py) overrides, with the leading parameters each
# override relies on (TRL 1.16). A renamed hook would otherwise be silently never called.
OVERRIDDEN_HOOKS: dict[str, tuple[str, ...]] = {
    "_prepare_inputs": ("generation_batch",),
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": (
        "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy", "compute_aux_loss",
    ),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "create_accelerator_and_postprocess": (),
}  # fmt: skip


def check_hooks(trainer_class: type = trl.GRPOTrainer) -> None:
    """Raise `RuntimeError` naming the hook if `trainer_class` lacks one we override or its parameters moved."""
    for name, expected in OVERRIDDEN_HOOKS.items():
        method = getattr(trainer_class, name, None)
        params = tuple(inspect.signature(method).parameters)[1 : len(expected) + 1] if method else None
        if params != expected:
            raise RuntimeError(
                f"trl {trl.__version__}: GRPOTrainer.{name} is {'missing' if method is None else params}, expected "
                f"{expected}; ColocateGRPOTrainer's override would not be called as written. Use trl "
                f"{SUPPORTED_TRL} or update colocate_grpo.trainer."
            )


def metrics_store(trainer) -> dict:
    """TRL's per-mode metric lists (`trainer._metrics["train"][name] -> list[float]`), averaged at each log."""
    return trainer._metrics


def tokenizer_of(trainer):
    """The trainer's text tokenizer (TRL keeps it apart from a multimodal `processing_class`)."""
    return trainer._tokenizer


def llm_view(max_model_len: int | None) -> SimpleNamespace:
    """What TRL's tool loop reads from `vllm_generation.llm`: `llm.llm_engine.model_config.max_model_len`, and
    nothing else, so our backend answers it without exposing an engine object."""
    return SimpleNamespace(
        llm_engine=SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len))
    )
