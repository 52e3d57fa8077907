"""Code-execution rewards: model-written Python run against tests in the sandbox (`rewards.sandbox`).

Two test formats, picked per sample from the dataset's columns:
- HumanEval: columns `test` (defines `check(candidate)`) and `entry_point`, plus `prompt_code` (the function
  signature and docstring the model completes). The program is the completion's code (with `prompt_code` in front
  when the completion is only the body) followed by the test and `check(entry_point)`: 1 if it exits cleanly.
- stdin/stdout: a column `tests` = `{"inputs": [...], "outputs": [...]}` (a dict or its JSON string); the program
  runs once per case and passes a case when its stripped stdout equals the expected output's.

`code_reward` scores the fraction of cases passed (HumanEval has one case); `code_binary_reward` 1 only when all
pass. Every program of a batch runs in parallel (one process per program, one worker per core).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable

from . import completion_text
from .sandbox import SandboxLimits, run_programs

_FENCE = re.compile(r"```(?:python|py|python3)?[^\n]*\n(.*?)```", re.DOTALL)


def sandbox_limits(timeout_s: float, memory_mb: int) -> SandboxLimits:
    """The recipe's `code_timeout_s` / `code_memory_mb` as sandbox limits (CPU seconds capped like wall seconds)."""
    return SandboxLimits(wall_s=timeout_s, cpu_s=max(1, math.ceil(timeout_s)), memory_mb=memory_mb)


def extract_code(text: str) -> str:
    """The last fenced code block of `text` (```python ... ```), or the whole text when there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def humaneval_program(prompt_code: str, completion: str, test: str, entry_point: str) -> str:
    """A program that exits 0 iff the completed function passes HumanEval's `check`."""
    code = extract_code(completion)
    if not re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE):
        code = prompt_code + code  # the completion is the function body only
    else:  # a full definition: keep the prompt's imports and helpers in front (a redefinition overrides them)
        code = prompt_code + "\n    pass\n\n" + code
    return f"{code}\n\n{test}\n\ncheck({entry_point})\n"


def _stdio_cases(tests) -> list[tuple[str, str]]:
    if isinstance(tests, str):
        tests = json.loads(tests)
    inputs, outputs = tests["inputs"], tests["outputs"]
    if len(inputs) != len(outputs):
        raise ValueError(f"tests: {len(inputs)} inputs but {len(outputs)} outputs")
    return list(zip(inputs, outputs, strict=True))


def _score(
    completions, binary: bool, limits: SandboxLimits, max_workers: int | None, **columns
) -> list[float]:
    jobs: list[tuple[str, str]] = []
    owners: list[tuple[int, str | None]] = []  # (sample, expected stdout or None for HumanEval)
    for i, completion in enumerate(completions):
        text = completion_text(completion)
        if columns.get("test") is not None and columns.get("entry_point") is not None:
            program = humaneval_program(
                columns.get("prompt_code", [""] * len(completions))[i] or "",
                text,
                columns["test"][i],
                columns["entry_point"][i],
            )
            jobs.append((program, ""))
            owners.append((i, None))
        elif columns.get("tests") is not None:
            code = extract_code(text)
            for stdin, expected in _stdio_cases(columns["tests"][i]):
                jobs.append((code, stdin))
                owners.append((i, expected))
        else:
            raise ValueError(
                "code reward: the dataset needs HumanEval columns (`test`, `entry_point`) or a `tests` column "
                '{"inputs": [...], "outputs": [...]}.'
            )
    passed = [0] * len(completions)
    total = [0] * len(completions)
    for (i, expected), result in zip(owners, run_programs(jobs, limits, max_workers), strict=True):
        total[i] += 1
        ok = result.status == "ok" and (expected is None or result.stdout.strip() == str(expected).strip())
        passed[i] += int(ok)
    if binary:
        return [float(t > 0 and p == t) for p, t in zip(passed, total, strict=True)]
    return [p / t if t else 0.0 for p, t in zip(passed, total, strict=True)]


def make_code_reward(
    limits: SandboxLimits | None = None, max_workers: int | None = None, binary: bool = False
) -> Callable[..., list[float]]:
    """A code reward with these sandbox settings.

    Args:
        limits (`SandboxLimits`, *optional*): per-program limits (default `SandboxLimits()`).
        max_workers (`int`, *optional*): programs run at once (default: this process's share of the cores).
        binary (`bool`, *optional*, defaults to `False`): 1 only when every test passes (`code_binary`), instead of
            the fraction of tests passed (`code`).
    """
    limits = limits or SandboxLimits()

    def reward(completions, **columns) -> list[float]:
        return _score(completions, binary, limits, max_workers, **columns)

    reward.__name__ = reward.__qualname__ = "code_binary_reward" if binary else "code_reward"
    reward.__doc__ = (
        "1 if the sample's program passes every test, else 0."
        if binary
        else "Fraction of the sample's tests its program passes (HumanEval: 0 or 1)."
    )
    return reward


# With the default limits; recipes get theirs from `build_reward_funcs(names, options)`.
code_reward = make_code_reward()
code_binary_reward = make_code_reward(binary=True)
