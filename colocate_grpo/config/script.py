"""What the command line adds to the trainer's options: the data and rewards (`ScriptArguments`) and the model
(`ModelArguments`), with the checks that need more than one of them (`check_lora_mode`)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Literal

import trl


@dataclass
class ScriptArguments(trl.ScriptArguments):
    """Data and reward arguments (TRL / open-r1 naming).

    Args:
        dataset_name (`str`):
            A hub id, a local file/folder (json, jsonl, parquet, csv), or a built-in offline task
            `reasoning_gym:<task>` (e.g. `reasoning_gym:basic_arithmetic`, `reasoning_gym:gsm_symbolic`).
        dataset_size (`int`, *optional*, defaults to `512`):
            Number of examples generated for a `reasoning_gym:` task.
        prompt_column (`str`, *optional*, defaults to `"prompt"`):
            Column holding the question text (or a ready list of chat messages).
        answer_column (`str`, *optional*, defaults to `"answer"`):
            Column holding the reference answer, passed to rewards as `answer`.
        system_prompt (`str`, *optional*):
            System message prepended to every prompt.
        prompt_format (`Literal["auto", "chat", "text"]`, *optional*, defaults to `"auto"`):
            `chat`: prompts become chat messages (rendered by the tokenizer's chat template); `text`: plain strings
            (system prompt and question joined by a blank line), for base models without a chat template. `auto`:
            chat when the tokenizer has a chat template, text otherwise.
        eval_dataset_name (`str`, *optional*):
            Evaluation data (same forms as `dataset_name`; its `dataset_test_split`, or the whole file). Unset, with
            `eval_strategy` on: the `dataset_test_split` of `dataset_name` (a folder's test file, a hub test split).
        reward_funcs (`list[str]`, *optional*, defaults to `["accuracy", "format"]`):
            Reward names from `colocate_grpo.rewards.REGISTRY`, or dotted paths `pkg.module.func` to user functions.
    """

    dataset_size: int = field(default=512, metadata={"help": "Examples generated for a reasoning_gym: task."})
    prompt_column: str = field(
        default="prompt", metadata={"help": "Column with the question text or messages."}
    )
    answer_column: str = field(default="answer", metadata={"help": "Column with the reference answer."})
    system_prompt: str | None = field(
        default=None, metadata={"help": "System message prepended to every prompt."}
    )
    prompt_format: Literal["auto", "chat", "text"] = field(
        default="auto",
        metadata={
            "help": "chat messages or plain text prompts; auto: chat if the tokenizer has a chat template."
        },
    )
    eval_dataset_name: str | None = field(
        default=None,
        metadata={"help": "Evaluation data (default with eval_strategy: the test split of dataset_name)."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["accuracy", "format"],
        metadata={"help": "Reward names (see colocate_grpo.rewards) or dotted paths to user functions."},
    )

    def __post_init__(self):
        if not self.dataset_name:
            raise ValueError("dataset_name is required: a hub id, a local file, or reasoning_gym:<task>.")
        if self.dataset_size < 1:
            raise ValueError(f"dataset_size must be >= 1, got {self.dataset_size}.")
        if not self.reward_funcs:
            raise ValueError("reward_funcs is empty: list at least one reward, e.g. [accuracy].")
        from ..rewards import check_reward_names

        check_reward_names(self.reward_funcs)


@dataclass
class ModelArguments(trl.ModelConfig):
    """`trl.ModelConfig` (model id, dtype, LoRA settings), checked at parse time."""

    def __post_init__(self):
        super().__post_init__()
        if not self.model_name_or_path:
            raise ValueError("model_name_or_path is required: a local model folder or a hub id.")
        if self.use_peft and importlib.util.find_spec("peft") is None:
            raise ValueError("use_peft=true needs peft: pip install 'colocate_grpo[peft]'.")


def check_lora_mode(training_args, model_args: ModelArguments) -> None:
    """Cross-dataclass checks for adapter-only sync, at parse time (before any model loads)."""
    if training_args.weight_sync_lora_mode != "adapter":
        return
    if not model_args.use_peft:
        raise ValueError(
            "weight_sync_lora_mode=adapter needs use_peft=true; or use weight_sync_lora_mode=merged."
        )
    from ..engine.lora import serving_settings

    serving_settings(
        model_args.lora_r,
        model_args.lora_target_modules,
        modules_to_save=model_args.lora_modules_to_save,
        use_dora=model_args.use_dora,
    )


def check_eval(script_args: ScriptArguments, training_args) -> None:
    """`eval_strategy` needs evaluation data; a generated task (`reasoning_gym:`, `humaneval`) has no test split."""
    if training_args.eval_strategy == "no" or script_args.eval_dataset_name:
        return
    name = script_args.dataset_name
    if name.startswith("reasoning_gym:") or name == "humaneval":
        raise ValueError(
            f"eval_strategy={training_args.eval_strategy}: dataset_name={name} has no test split; set "
            "eval_dataset_name (e.g. another reasoning_gym task, or a file of held-out problems), or eval_strategy: no."
        )
