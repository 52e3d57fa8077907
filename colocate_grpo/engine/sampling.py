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
    seed: int | None = None
    """Base seed of one `generate` call; each request derives its own from it (`request_seed`). `None`: vLLM's
    global RNG, seeded per replica when the engine was built."""


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


def request_seed(base: int, replica: int, index: int) -> int:
    """Seed of request `index` of one `generate` call of inference replica `replica` (splitmix64 of the three):
    identical on every rank of a TP group, distinct across replicas, calls and repeated prompts. In `[0, 2**31)`."""
    state = (base * 0x9E3779B97F4A7C15 + replica * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & _U64
    state ^= state >> 30
    state = (state * 0xBF58476D1CE4E5B9) & _U64
    state ^= state >> 27
    state = (state * 0x94D049BB133111EB) & _U64
    return (state ^ (state >> 31)) & 0x7FFFFFFF


_U64 = (1 << 64) - 1
