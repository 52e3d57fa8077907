"""Math accuracy with math-verify: the completion's final answer (boxed, <answer> tag, or last number) vs the reference."""

from __future__ import annotations

import re
import threading

from . import completion_text

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def _final_answer(text: str) -> str:
    """The span math-verify should read: an <answer> tag or \\boxed{} if present, else the last number."""
    tag = _ANSWER_TAG.findall(text)
    if tag:
        return tag[-1]
    if "\\boxed" in text:
        return text
    numbers = _NUMBER.findall(text)
    return f"${numbers[-1].replace(',', '')}$" if numbers else ""


def accuracy_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """1.0 if the completion's final answer equals the reference `answer` (math-verify), 0.0 if not.

    Returns `None` for a sample whose reference cannot be parsed (it then doesn't count for this reward).
    """
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise ImportError(
            "The accuracy reward needs math-verify: pip install 'colocate_grpo[math]'."
        ) from exc
    # math-verify's timeouts use signal.alarm, which only works on the main thread.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    rewards: list[float | None] = []
    for completion, ref in zip(completions, answer):
        ref = str(ref)
        # A worked solution (MATH's `solution` column) is parsed as is, to find its \boxed{}; a bare answer in $...$.
        as_latex = ref if ref.startswith("$") or "\\boxed" in ref else f"${ref}$"
        gold = parse(as_latex, parsing_timeout=timeout)
        if not gold:
            rewards.append(None)
            continue
        pred = parse(_final_answer(completion_text(completion)), parsing_timeout=timeout)
        rewards.append(1.0 if pred and verify(gold, pred, timeout_seconds=timeout) else 0.0)
    return rewards
