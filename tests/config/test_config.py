"""Config parsing: precedence, unknown keys, and every validation error, all before any model loads."""

import re
from pathlib import Path

import pytest
import torch
import yaml

from colocate_grpo.cli import make_parser

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "model_name_or_path": "some/model",
    "dataset_name": "reasoning_gym:basic_arithmetic",
    "output_dir": "outputs/x",
    "per_device_train_batch_size": 4,
    "num_generations": 4,
}


def parse(tmp_path, recipe: dict, *flags: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return make_parser().parse_args_and_config(args=["--config", str(path), *flags])


def test_defaults_then_yaml_then_cli(tmp_path):
    script, train, model = parse(
        tmp_path, {**BASE, "learning_rate": 2e-5, "max_completion_length": 32}, "--learning_rate", "3e-6"
    )
    assert train.learning_rate == 3e-6  # CLI beats YAML
    assert train.max_completion_length == 32  # YAML beats default
    assert train.weight_sync_probe is True and train.vllm_mode == "colocate"  # defaults
    assert script.reward_funcs == ["accuracy", "format"] and model.model_name_or_path == "some/model"
    assert train.use_cpu is True and train.bf16 is False  # CPU specifics set by the package


def test_unknown_yaml_key_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="learning_rat"):
        parse(tmp_path, {**BASE, "learning_rat": 1e-5})


@pytest.mark.parametrize(
    "override, message",
    [
        ({"vllm_tensor_parallel_size": 3}, "vllm_tensor_parallel_size=3 must divide"),
        ({"vllm_enable_sleep_mode": True}, "vllm_enable_sleep_mode"),
        ({"weight_sync_probe_tolerance": -1.0}, "weight_sync_probe_tolerance"),
        ({"use_vllm": False}, "use_vllm=false"),
        ({"num_generations": 3}, "num_generations"),
        ({"reward_funcs": ["no_such_reward"]}, "reward_funcs"),
        ({"reward_funcs": ["colocate_grpo.rewards.nope"]}, "reward_funcs"),
        ({"reward_funcs": []}, "reward_funcs"),
        ({"dataset_size": 0}, "dataset_size"),
        ({"weight_sync_bucket_mb": 0}, "weight_sync_bucket_mb"),
        ({"vllm_cpu_kvcache_space_gb": 0}, "vllm_cpu_kvcache_space_gb"),
        ({"max_completion_length": 0}, "max_completion_length"),
        # TRL options its own backend would honour and ours does not: rejected, never silently dropped.
        ({"vllm_structured_outputs_regex": "[0-9]+"}, "vllm_structured_outputs_regex"),
        (
            {"vllm_mode": "server", "vllm_model_impl": "transformers"},
            "in server mode pass --model-impl transformers",
        ),
    ],
)
def test_validation_errors_name_the_field(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        parse(tmp_path, {**BASE, **override})


def test_bad_literal_value_is_rejected(tmp_path):
    with pytest.raises((ValueError, SystemExit)):
        parse(tmp_path, BASE, "--vllm_dtype", "float8")


def test_missing_model_and_dataset(tmp_path):
    with pytest.raises(ValueError, match="model_name_or_path"):
        parse(tmp_path, {k: v for k, v in BASE.items() if k != "model_name_or_path"})
    with pytest.raises(ValueError, match="dataset_name"):
        parse(tmp_path, {k: v for k, v in BASE.items() if k != "dataset_name"})


@pytest.mark.parametrize(
    "recipe", sorted((ROOT / "recipes").rglob("*.yaml")), ids=lambda p: p.parent.name + "/" + p.name
)
def test_every_recipe_parses(recipe):
    text = recipe.read_text()
    assert text.startswith("#") and "accelerate launch" in text.split("\n\n")[0] + text[:600], (
        "header = launch command"
    )
    # The header's launch command names the world size; its TP size must divide it. The parse itself runs in this
    # single process (setting WORLD_SIZE here would make accelerate try to join a real process group).
    match = re.search(r"--num_processes (\d+)", text)
    world = int(match.group(1)) if match else 2
    tp = yaml.safe_load(text).get("vllm_tensor_parallel_size", 1)
    assert world % tp == 0
    script, train, model = make_parser().parse_args_and_config(
        args=["--config", str(recipe), "--vllm_tensor_parallel_size", "1"]
    )
    assert model.model_name_or_path and script.dataset_name and train.output_dir


def test_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for option in (
        "--vllm_tensor_parallel_size",
        "--weight_sync_probe_tolerance",
        "--reward_funcs",
        "--dataset_name",
        "--system_prompt",
        "--model_name_or_path",
    ):
        assert option in out


def test_fsdp1_without_orig_params_is_rejected_before_loading(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setenv("FSDP_USE_ORIG_PARAMS", "false")
    with pytest.raises(ValueError, match="fsdp_use_orig_params"):
        parse(tmp_path, BASE)


def test_impossible_engine_dtype_is_a_named_error_before_loading(tmp_path):
    from colocate_grpo.cli import main
    from colocate_grpo.config import check_engine_dtype

    with pytest.raises(ValueError, match="vllm_dtype=bfloat16: this GPU .compute capability 7.5"):
        check_engine_dtype("bfloat16", "llama", (7, 5))
    check_engine_dtype("bfloat16", "llama", (8, 0))
    # Through the CLI: a bf16-only model type asked to run in float16 stops at parse time (the folder holds only a
    # config: nothing could be loaded, and nothing is).
    model = tmp_path / "gemma"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "gemma2"}')
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**BASE, "model_name_or_path": str(model), "vllm_dtype": "float16"}))
    with pytest.raises(
        SystemExit, match="colocate_grpo: vllm_dtype=float16: vLLM cannot run gemma2 models in float16"
    ):
        main(["--config", str(recipe)])
    check_engine_dtype("auto", "gemma2", None)  # vLLM's own rule never picks float16 for them


GPU_RECIPES = sorted(
    p for p in (ROOT / "recipes").rglob("*.yaml") if "cpu" not in p.name and p.parent.name != "tiny"
)


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.parent.name + "/" + p.name)
def test_gpu_recipes_resolve_coherently_on_a_cuda_host(recipe):
    """What each GPU recipe becomes on its intended host (an Ampere+ GPU), resolved with the package's own rules:
    the engine dtype vLLM picks, the probe's statistic and tolerance for it, the sleep level, and the settings a
    bf16 engine needs (gradient checkpointing, TRL's importance-sampling correction left on)."""
    from types import SimpleNamespace

    from colocate_grpo.config import check_engine_dtype
    from colocate_grpo.weight_sync.probe import probe_settings

    text = recipe.read_text()
    settings = yaml.safe_load(text)
    world = int(re.search(r"--num_processes (\d+)", text).group(1))
    assert world % settings.get("vllm_tensor_parallel_size", 1) == 0
    check_engine_dtype(
        settings.get("vllm_dtype"), "qwen2" if "qwen" in recipe.parent.name else "llama", (8, 0)
    )
    # vLLM's auto on an Ampere+ GPU: the checkpoint dtype (these hub checkpoints are bf16; fp32 would become bf16).
    requested = settings.get("vllm_dtype")
    engine = torch.bfloat16 if requested in (None, "auto") else getattr(torch, requested)
    trainer = getattr(torch, settings.get("dtype", "float32"))
    # bf16 trainer (the recipes load bf16 weights): a fixed tolerance on the mean; fp32 master weights: the ratio.
    expected = ("mean", 0.5) if trainer == torch.bfloat16 else ("ratio", 4.0)
    assert probe_settings(engine, trainer) == expected
    assert settings.get("bf16") is True and settings.get("gradient_checkpointing") is True
    assert settings.get("vllm_importance_sampling_correction", True) is True  # a bf16 engine needs it
    assert (
        settings.get("vllm_mode", "colocate") == "server"
        or settings.get("vllm_gpu_memory_utilization", 0.3) < 1
    )
    # Sleep level with these batch settings (every weight trainable: full fine-tune).
    args = SimpleNamespace(
        steps_per_generation=settings.get("steps_per_generation")
        or settings.get("gradient_accumulation_steps", 1),
        num_iterations=settings.get("num_iterations", 1),
        gradient_accumulation_steps=settings.get("gradient_accumulation_steps", 1),
    )
    from colocate_grpo.trainer.generation import sleep_level_for

    assert sleep_level_for(torch.nn.Linear(2, 2), args) == 2


def test_fsdp1_checkpoints_on_cpu_are_refused_before_loading(tmp_path, monkeypatch):
    """accelerate's FSDP1 checkpoint writer crashes rank 0 on CPU: said at parse time, with the ways out."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only rule")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match="save_strategy=steps with FSDP1 on CPU"):
        parse(tmp_path, {**BASE, "save_strategy": "steps"})
    parse(tmp_path, {**BASE, "save_strategy": "no"})  # control: the final model alone is fine
    monkeypatch.setenv("FSDP_VERSION", "2")
    parse(tmp_path, {**BASE, "save_strategy": "steps"})  # control: FSDP2 checkpoints work
