"""Task rewards: reasoning-gym tasks scored by their own scorers.

Datasets from `dataset_name: reasoning_gym:<task>[,...]` carry `task` and `rg_entry` (the generated entry, JSON)
columns; `reasoning_gym_reward` extracts the completion's answer (an `<answer>` tag, else the last `\\boxed{}`,
else the last non-empty line) and returns the task's `score_answer(answer, entry)` (0..1, partial credit where
the task gives it).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from . import completion_text

_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)


def extract_final_answer(text: str) -> str:
    tags = _ANSWER.findall(text)
    if tags:
        return tags[-1].strip()
    start = text.rfind("\\boxed{")
    if start >= 0:
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


@lru_cache(maxsize=64)
def _scorer(task: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=1, seed=0)


def reasoning_gym_reward(completions, rg_entry=None, task=None, **_) -> list[float | None]:
    """The task's own score of each completion's final answer; None for rows without a reasoning-gym entry."""
    if rg_entry is None or task is None:
        raise ValueError(
            "reasoning_gym reward: the dataset has no rg_entry/task columns; use dataset_name: reasoning_gym:<task>."
        )
    rewards: list[float | None] = []
    for completion, entry, name in zip(completions, rg_entry, task, strict=True):
        if not entry:
            rewards.append(None)
            continue
        answer = extract_final_answer(completion_text(completion))
        rewards.append(float(_scorer(name).score_answer(answer, json.loads(entry))))
    return rewards
