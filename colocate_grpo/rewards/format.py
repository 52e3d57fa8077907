"""Format rewards: structure of the answer, independent of correctness."""

from __future__ import annotations

import re

from . import completion_text

_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{[^{}]+\}")


def think_answer_format_reward(completions: list, **kwargs) -> list[float]:
    """1.0 if the completion is `<think>...</think><answer>...</answer>` (whitespace allowed), else 0.0."""
    return [1.0 if _THINK_ANSWER.match(completion_text(c)) else 0.0 for c in completions]


def boxed_answer_reward(completions: list, **kwargs) -> list[float]:
    """1.0 if the completion puts a final answer in `\\boxed{...}` exactly once, else 0.0."""
    return [1.0 if len(_BOXED.findall(completion_text(c))) == 1 else 0.0 for c in completions]
