"""What the engine is asked for and what it returns, independent of vLLM: sampling settings and rollouts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingConfig:
    """Sampling settings shared by every rank (TRL's names and semantics)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    extra: dict | None = None


@dataclass
class Rollouts:
    """What one `generate` call returns for this rank's own prompts.

    Attributes:
        prompt_ids (`list[list[int]]`): shape `[batch, prompt_len_i]`.
        completion_ids (`list[list[int]]`): shape `[batch, completion_len_i]`.
        logprobs (`list[list[float]]`): the sampled tokens' logprobs, shape `[batch, completion_len_i]`.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
