"""Reward functions that fail loudly and precisely, or skip the bad sample; never a non-finite reward in the loss.

`guard_reward(func, on_error)` wraps one reward function (keeping its name, which TRL logs it under):
- if it raises, the batch is re-scored one sample at a time to find the culprit; `on_error="raise"` then raises
  `RewardError` naming the function, the sample index, its prompt and completion (shortened) and the original
  error; `on_error="skip"` gives exactly the failing samples `None`, which TRL excludes from that function's
  statistics (and, with every function `None`, from the sample's advantage);
- non-finite values (`nan`, `inf`) become `None` as well, so they can never reach the loss;
- per call it logs `rewards/<name>/errors` and `rewards/<name>/non_finite` (counts) through TRL's `log_metric`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

_TRL_ONLY = ("trainer_state", "log_extra", "log_metric", "environments")


class RewardError(RuntimeError):
    """A reward function raised on a sample (`on_error="raise"`)."""


def _name(func: Callable) -> str:
    return getattr(func, "__name__", None) or type(func).__name__


def _shorten(value, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2 :]


def _sample_kwargs(kwargs: dict, i: int, n: int) -> dict:
    """The keyword arguments of one sample: per-sample lists sliced to `[i]`, everything else as is."""
    out = {}
    for key, value in kwargs.items():
        if key not in _TRL_ONLY and isinstance(value, list) and len(value) == n:
            out[key] = [value[i]]
        else:
            out[key] = value
    return out


def guard_reward(func: Callable, on_error: str = "raise") -> Callable:
    """Wrap `func(prompts=..., completions=..., **columns) -> list[float | None]`; see the module docstring."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"reward_on_error must be 'raise' or 'skip', got {on_error!r}.")
    name = _name(func)

    @functools.wraps(func)
    def guarded(*args, **kwargs):
        completions = kwargs.get("completions", args[0] if args else [])
        n = len(completions)
        errors = 0
        try:
            rewards = list(func(*args, **kwargs))
        except Exception:  # noqa: BLE001 - re-scored per sample below to name the culprit
            if args:  # positional call: cannot slice per sample, report as is
                raise
            rewards = []
            for i in range(n):
                try:
                    (value,) = func(**_sample_kwargs(kwargs, i, n))
                except Exception as exc:  # noqa: BLE001
                    if on_error == "raise":
                        prompt = kwargs.get("prompts", [None] * n)[i]
                        raise RewardError(
                            f"Reward function '{name}' raised {type(exc).__name__}: {exc} on sample {i} "
                            f"(prompt {_shorten(prompt)}, completion {_shorten(completions[i])}). Fix the function "
                            "or set reward_on_error: skip to give such samples no reward (None)."
                        ) from exc
                    errors += 1
                    value = None
                rewards.append(value)
        non_finite = 0
        for i, value in enumerate(rewards):
            if value is not None and not math.isfinite(float(value)):
                rewards[i] = None
                non_finite += 1
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric(f"rewards/{name}/errors", float(errors))
            log_metric(f"rewards/{name}/non_finite", float(non_finite))
        return rewards

    guarded.__wrapped_reward__ = func
    return guarded
