"""Command line: `python -m colocate_grpo --config recipe.yaml [--field value ...]`.

Multi-process: `accelerate launch --config_file accelerate_configs/cpu.yaml -m colocate_grpo --config recipe.yaml`.
Flags override the YAML recipe, which overrides the defaults; `--help` lists every field.
"""

from __future__ import annotations

import trl

from .config import ColocateGRPOConfig, ModelArguments, ScriptArguments, check_engine_dtype, check_lora_mode


def make_parser() -> trl.TrlParser:
    return trl.TrlParser((ScriptArguments, ColocateGRPOConfig, ModelArguments))


def check_model_dtypes(training_args: ColocateGRPOConfig, model_args: ModelArguments) -> None:
    """The engine dtype against the checkpoint's model type and the GPU, from the local config.json (no download)."""
    import json
    from pathlib import Path

    import torch

    config = Path(model_args.model_name_or_path) / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    check_engine_dtype(training_args.vllm_dtype, model_type, capability)


def main(argv: list[str] | None = None) -> None:
    import torch

    from .trainer.cpu_sharding import configure_cpu_sharding_env

    if not torch.cuda.is_available():
        configure_cpu_sharding_env()  # before the config builds a DeepSpeed plugin (DeepSpeed reads it at import)
    script_args, training_args, model_args = make_parser().parse_args_and_config(args=argv)
    check_lora_mode(training_args, model_args)
    check_model_dtypes(training_args, model_args)
    from .data import load_prompts
    from .rewards import build_reward_funcs, check_reward_inputs
    from .trainer.grpo import ColocateGRPOTrainer

    reward_funcs = build_reward_funcs(script_args.reward_funcs, training_args)
    dataset = load_prompts(script_args, seed=training_args.seed)
    check_reward_inputs(script_args.reward_funcs, dataset.column_names)
    init_kwargs = dict(training_args.model_init_kwargs or {})
    init_kwargs.setdefault("dtype", model_args.dtype or "auto")
    init_kwargs.setdefault("revision", model_args.model_revision)
    training_args.model_init_kwargs = init_kwargs

    trainer = ColocateGRPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        peft_config=trl.get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        print(f"colocate_grpo: model, logs and metrics.png saved in {training_args.output_dir}")
