"""Rewards: pure functions `(completions, **columns) -> list[float | None]`, built lazily by name.

`build_reward_funcs(["accuracy", "format", "my_pkg.rewards.brevity"], options)` returns only what the recipe lists;
names not in `REGISTRY` are imported as dotted paths. Parameterised rewards (`FACTORIES`) are built from the run's
`RewardOptions`: no module holds state a recipe sets. Completions are TRL's: plain strings, or for chat prompts a
one-message list `[{"role": "assistant", "content": ...}]`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.rewards import RewardOptions

RewardFunc = Callable[..., list]

# name -> "module:factory"; factories are imported only when the recipe uses them (math-verify is optional).
REGISTRY: dict[str, str] = {
    "accuracy": "colocate_grpo.rewards.math:accuracy_reward",
    "format": "colocate_grpo.rewards.format:think_answer_format_reward",
    "boxed": "colocate_grpo.rewards.format:boxed_answer_reward",
    "code": "colocate_grpo.rewards.code:code_reward",  # default limits; `build_reward_funcs` uses FACTORIES
    "code_binary": "colocate_grpo.rewards.code:code_binary_reward",
    "reasoning_gym": "colocate_grpo.rewards.tasks:reasoning_gym_reward",
}


def _import_dotted(path: str) -> RewardFunc:
    module_name, _, attr = path.replace(":", ".").rpartition(".")
    if not module_name:
        raise ValueError(
            f"reward_funcs: unknown reward {path!r}; use one of {sorted(REGISTRY)} or a dotted path pkg.module.func."
        )
    try:
        func = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"reward_funcs: cannot import {path!r} ({exc}); check the dotted path.") from exc
    if not callable(func):
        raise ValueError(f"reward_funcs: {path!r} is not callable.")
    return func


# Columns a registered reward reads; any one alternative must be present in the dataset.
REQUIRED_COLUMNS: dict[str, list[tuple[str, ...]]] = {
    "accuracy": [("answer",)],
    "code": [("test", "entry_point"), ("tests",)],
    "code_binary": [("test", "entry_point"), ("tests",)],
    "reasoning_gym": [("rg_entry", "task")],
}


def check_reward_inputs(names: list[str], columns: list[str]) -> None:
    """Before any model loads: every registered reward finds its columns, and code rewards can sandbox here."""
    for name in names:
        options = REQUIRED_COLUMNS.get(name)
        if options and not any(set(option) <= set(columns) for option in options):
            wanted = " or ".join("+".join(option) for option in options)
            raise ValueError(
                f"reward_funcs: {name!r} needs dataset columns {wanted}, but the dataset has {sorted(columns)}; "
                "pick a dataset that provides them (e.g. dataset_name: humaneval for code, reasoning_gym:<task> for "
                "reasoning_gym) or another reward."
            )
        if name in ("code", "code_binary"):
            from .sandbox import sandbox_python

            sandbox_python()  # raises SandboxUnavailable with the fix on machines that cannot sandbox


def check_reward_names(names: list[str]) -> None:
    """Fail at parse time on names that are neither registered nor importable."""
    for name in names:
        if name not in REGISTRY:
            _import_dotted(name)


def _code_reward(options: RewardOptions, binary: bool) -> RewardFunc:
    from .code import make_code_reward, sandbox_limits

    limits = sandbox_limits(options.code_timeout_s, options.code_memory_mb)
    return make_code_reward(limits, options.code_max_workers, binary=binary)


# Rewards with options: name -> factory(options: RewardOptions) -> reward function.
FACTORIES: dict[str, Callable[[RewardOptions], RewardFunc]] = {
    "code": lambda options: _code_reward(options, binary=False),
    "code_binary": lambda options: _code_reward(options, binary=True),
}


def build_reward_funcs(names: list[str], options: RewardOptions | None = None) -> list[RewardFunc]:
    """Build the reward functions a recipe lists, in order (so `reward_weights` line up).

    Args:
        names (`list[str]`): registered names or dotted paths.
        options (`RewardOptions`, *optional*): the run's reward options (e.g. `code_timeout_s`), for the rewards in
            `FACTORIES`; `None` builds those with their defaults.
    """
    funcs = []
    for name in names:
        if name in FACTORIES and options is not None:
            funcs.append(FACTORIES[name](options))
        else:
            funcs.append(_import_dotted(REGISTRY.get(name, name)))
    return funcs


def completion_text(completion) -> str:
    """The text of one TRL completion (a string, or a list of chat messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")
