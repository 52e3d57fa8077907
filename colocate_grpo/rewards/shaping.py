"""DAPO soft overlong punishment (Yu et al. 2025, eq. 13), as a reward function on completion lengths."""

from __future__ import annotations


def overlong_penalty_value(length: int, max_length: int, cache_length: int) -> float:
    """0 up to `max_length - cache_length` tokens, then linearly down to -1 at `max_length`; -1 beyond."""
    expected = max_length - cache_length
    if length <= expected:
        return 0.0
    if length <= max_length:
        return (expected - length) / cache_length
    return -1.0


def make_overlong_penalty(max_length: int, cache_length: int):
    """The reward function `overlong_penalty(completion_ids=...)` for a run's `max_completion_length`."""
    if not 0 < cache_length < max_length:
        raise ValueError(f"overlong cache length must be in (0, {max_length}), got {cache_length}.")

    def overlong_penalty(completions, completion_ids=None, **_) -> list[float]:
        if completion_ids is None:
            raise ValueError("overlong_penalty needs completion_ids (TRL passes them to reward functions).")
        return [overlong_penalty_value(len(ids), max_length, cache_length) for ids in completion_ids]

    return overlong_penalty
