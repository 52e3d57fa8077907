"""Command line: `python -m colocate_grpo --config recipe.yaml [--field value ...]`.

Multi-process: `accelerate launch --config_file accelerate_configs/cpu.yaml -m colocate_grpo --config recipe.yaml`.
Flags override the YAML recipe, which overrides the defaults; `--help` lists every field.
"""

from __future__ import annotations

import ast
import contextlib
import difflib

import trl

from .config import ColocateGRPOConfig, ModelArguments, ScriptArguments


def make_parser() -> trl.TrlParser:
    # No prefix matching: `--learning_rat` must be an error, not `--learning_rate`.
    return trl.TrlParser((ScriptArguments, ColocateGRPOConfig, ModelArguments), allow_abbrev=False)


@contextlib.contextmanager
def _bad_input(parser: trl.TrlParser | None = None):
    """A `ValueError` from parsing or checking the inputs exits with one line naming the field and the fix (and, for a
    mistyped flag, the flag it resembles) instead of a traceback."""
    try:
        yield
    except ValueError as exc:
        message = str(exc)
        if parser is not None and message.startswith("Some specified arguments are not used"):
            known = [a for action in parser._actions for a in action.option_strings]
            unknown = [
                a.split("=")[0] for a in ast.literal_eval(message.split(": ", 1)[1]) if a.startswith("--")
            ]
            hints = {a: difflib.get_close_matches(a, known, n=1) for a in unknown}
            message = "unknown option(s): " + ", ".join(
                a + (f" (did you mean {h[0]}?)" if h else "") for a, h in hints.items()
            )
        raise SystemExit(f"colocate_grpo: {message}") from None


def parse(argv: list[str] | None = None) -> tuple[ScriptArguments, ColocateGRPOConfig, ModelArguments]:
    """Parse and check everything that can be checked before a model loads (`colocate_grpo.preflight`)."""
    from .preflight import check_all

    parser = make_parser()
    with _bad_input(parser):
        script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
        check_all(script_args, training_args, model_args)
    return script_args, training_args, model_args


def prepare_data(script_args: ScriptArguments, training_args: ColocateGRPOConfig, model_args: ModelArguments):
    """The reward functions and the training prompts, each reward's columns checked: still before any model loads."""
    from .data import load_eval_prompts, load_split, prompt_columns, to_chat
    from .preflight import uses_chat
    from .rewards import build_reward_funcs, check_reward_inputs

    with _bad_input():
        reward_funcs = build_reward_funcs(script_args.reward_funcs, training_args)
        raw = load_split(script_args, seed=training_args.seed)
        # Every reward finds its columns before anything of the model is read (the tokenizer included).
        check_reward_inputs(script_args.reward_funcs, prompt_columns(raw.column_names, script_args))
        chat = uses_chat(script_args, model_args)
        prompt, answer, system = (
            script_args.prompt_column,
            script_args.answer_column,
            script_args.system_prompt,
        )
        dataset = to_chat(raw, prompt, answer, system, chat)
        evaluation = None
        if training_args.eval_strategy != "no":
            evaluation = load_eval_prompts(script_args, seed=training_args.seed, chat=chat)
            check_reward_inputs(script_args.reward_funcs, evaluation.column_names)
    return reward_funcs, dataset, evaluation


def main(argv: list[str] | None = None) -> None:
    import torch

    from .trainer.cpu_sharding import configure_cpu_sharding_env

    if not torch.cuda.is_available():
        configure_cpu_sharding_env()  # before the config builds a DeepSpeed plugin (DeepSpeed reads it at import)
    script_args, training_args, model_args = parse(argv)
    reward_funcs, dataset, evaluation = prepare_data(script_args, training_args, model_args)
    from .trainer.grpo import ColocateGRPOTrainer

    init_kwargs = dict(training_args.model_init_kwargs or {})
    init_kwargs.setdefault("dtype", model_args.dtype or "auto")
    init_kwargs.setdefault("revision", model_args.model_revision)
    training_args.model_init_kwargs = init_kwargs

    trainer = ColocateGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        eval_dataset=evaluation,
        peft_config=trl.get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"colocate_grpo: model, logs and metrics.png saved in {training_args.output_dir}")
