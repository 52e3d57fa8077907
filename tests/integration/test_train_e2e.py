"""End to end through the real launcher: `accelerate launch -m colocate_grpo` on the tiny model, 2 processes."""

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers.launch import bin_path, launch_tiny, run_cmd, synced_steps

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("tp,eager", [(1, "false"), (2, "true")], ids=["tp1-compiled", "tp2-eager"])
def test_accelerate_launch_trains_syncs_and_saves(tiny_model, tmp_path, tp, eager):
    out = tmp_path / "run"
    result = launch_tiny(
        tiny_model, out, 29700 + tp, "--vllm_tensor_parallel_size", str(tp), "--vllm_enforce_eager", eager
    )
    assert result.returncode == 0, result.stderr[-4000:]
    steps = synced_steps(out)
    assert len(steps) == 3
    # The probe ran after every sync and always matched (fp32 tolerance 1e-3; a correct push gives ~1e-6).
    assert all(row["sync/probe_max_logprob_diff"] < 1e-4 for row in steps)
    assert all(row["sync/bytes"] > 0 for row in steps)
    assert (out / "metrics.png").stat().st_size > 0
    # Really distributed: each step consumes 2 ranks x 4 completions = 2 prompt groups of the 64-prompt dataset
    # (a launch that silently fell back to one process would consume 1).
    assert steps[-1]["epoch"] == pytest.approx(3 * 2 / 64)
    # The saved model reloads and its weights moved away from the starting checkpoint.
    before, after = load_file(tiny_model / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)


def test_skipped_sync_stops_training_with_stale_weights_error(tiny_model, tmp_path):
    result = run_cmd(
        [bin_path("python"), "tests/workers/skip_sync_worker.py", str(tiny_model), str(tmp_path / "run")],
        timeout=400,
    )
    assert result.returncode != 0
    assert "StaleWeightsError" in result.stderr
    # The exact digest stops it at the first dropped sync, naming the layers the engine did not receive.
    assert "Weight-sync digest failed at step 1" in result.stderr, result.stderr[-3000:]
    assert "does not hold the weights that were sent" in result.stderr
    assert "layers that differ here: model" in result.stderr


def test_lora_merge_then_sync_matches_after_every_step(tiny_model, tmp_path):
    out = tmp_path / "lora"
    result = launch_tiny(
        tiny_model,
        out,
        29711,
        "--use_peft",
        "true",
        "--lora_r",
        "8",
        "--lora_alpha",
        "16",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "up_proj",
        "--learning_rate",
        "5e-2",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    diffs = [row["sync/probe_max_logprob_diff"] for row in synced_steps(out)]
    assert len(diffs) == 3 and max(diffs) < 1e-4
    # The adapter really trained (LoRA B starts at zero), so syncs 2 and 3 pushed merged weights != the base.
    adapter = load_file(out / "adapter_model.safetensors")
    assert any("lora_B" in k and adapter[k].abs().max() > 0 for k in adapter)


def test_code_reward_training_on_humaneval_with_dapo_options(tiny_model, tmp_path):
    """2 processes train on 8 HumanEval problems with the sandboxed code reward, dynamic sampling, overlong shaping
    and truncated-completion masking; every rank scores its programs in the sandbox, every round."""
    out = tmp_path / "run"
    flags = ["--dataset_name", "humaneval", "--dataset_size", "8", "--reward_funcs", "code"]
    flags += [
        "--dynamic_sampling",
        "true",
        "--dynamic_sampling_max_rounds",
        "2",
        "--overlong_buffer_length",
        "8",
    ]
    flags += ["--mask_truncated_completions", "true", "--reward_on_error", "skip"]
    result = launch_tiny(tiny_model, out, 29731, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [
        r for r in json.loads((out / "log_history.json").read_text()) if "sync/probe_max_logprob_diff" in r
    ]
    assert len(steps) == 3
    for row in steps:
        assert row["rewards/code_reward/mean"] == 0.0  # random text never passes a HumanEval check
        assert row["rewards/code_reward/errors"] == 0.0  # ...but every program ran and was scored
        # Random text also hits the length cap: no group has reward variance, so each step runs the first round
        # plus the 2 extra rounds on fresh prompts, then fills its one group per process with a filtered one.
        assert row["rewards/overlong_penalty/mean"] == -1.0
        assert (row["dynamic_sampling/rounds"], row["dynamic_sampling/filtered_groups"]) == (3.0, 3.0)
        assert row["dynamic_sampling/filled_with_filtered"] == 1.0
        assert row["sync/probe_max_logprob_diff"] < 1e-4


def _assert_verified_every_step(history: list[dict], metric: str, tolerance: float) -> list[dict]:
    steps = [row for row in history if "sync/probe_max_logprob_diff" in row]
    assert len(steps) == 3
    assert all(
        row["sync/digest_mismatched_layers"] == 0.0 for row in steps if "sync/digest_mismatched_layers" in row
    )
    assert all(row[metric] < tolerance for row in steps)
    # The train-inference mismatch of the sampled tokens is logged every step (what the engine precision costs).
    assert all(row["sampling/train_inference_kl"] >= 0.0 for row in steps)
    return steps


def test_gpu_shaped_bf16_checkpoint_auto_dtype_tp2_gradient_checkpointing(tiny_model, tmp_path):
    """A bf16 checkpoint with `vllm_dtype: auto` (vLLM keeps bf16), a bf16 trainer, gradient checkpointing (TRL's
    and every GPU recipe's default) and TP=2 with per-request seeds: trains, and every sync is verified."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = tmp_path / "tiny-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(checkpoint)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(checkpoint)
    out = tmp_path / "run"
    flags = ["--vllm_dtype", "auto", "--dtype", "bfloat16", "--gradient_checkpointing", "true"]
    flags += ["--vllm_tensor_parallel_size", "2", "--learning_rate", "1e-2"]
    result = launch_tiny(checkpoint, out, 29741, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    # bf16 trainer: the fixed tolerance on the mean (0.5); a correct sync of the tiny model sits far below it.
    history = json.loads((out / "log_history.json").read_text())
    steps = _assert_verified_every_step(history, "sync/probe_mean_logprob_diff", 0.5 / 10)
    assert all(row["sync/digest_mismatched_layers"] == 0.0 for row in steps)
    assert "sampling/importance_sampling_ratio/mean" in steps[0]  # 16-bit: TRL's IS correction stays on
    after = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in after.values())
    assert any(not torch.equal(load_file(checkpoint / "model.safetensors")[k], after[k]) for k in after)


def test_gpu_shaped_bf16_engine_fp32_trainer_lora_adapter_mode(tiny_model, tmp_path):
    """The usual GPU set-up: float32 master weights, a bf16 engine, gradient checkpointing, LoRA adapter-only sync."""
    out = tmp_path / "run"
    flags = ["--vllm_dtype", "bfloat16", "--gradient_checkpointing", "true", "--use_peft", "true"]
    flags += ["--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "v_proj", "up_proj"]
    flags += ["--weight_sync_lora_mode", "adapter", "--learning_rate", "5e-2"]
    result = launch_tiny(tiny_model, out, 29751, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    # fp32 trainer, bf16 engine: the engine's error over bf16 rounding's own (tolerance 4), as small as it can be.
    steps = _assert_verified_every_step(
        json.loads((out / "log_history.json").read_text()), "sync/probe_ratio", 2.0
    )
    assert steps[0]["sync/digest_mismatched_layers"] == 0.0  # the base weights, sent once, verified exactly
    assert steps[-1]["sync/bytes"] < 0.05 * steps[0]["sync/bytes"]  # then only the adapter
    assert max(row["sampling/train_inference_kl"] for row in steps) > 0.0  # bf16 sampling is not fp32 scoring


def test_cli_trains_on_the_train_file_of_a_folder_and_evaluates_on_its_test_file(tiny_model, tmp_path):
    """A dataset folder as users keep one (train.jsonl + test.jsonl, open-r1's `solution` column): only the train file
    is trained on, the accuracy reward reads the references, and `eval_strategy` alone evaluates on the test file
    through the engine (eval rewards per function in the log)."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"What is {i} + 1?", "solution": str(i + 1)} for i in range(32)]
    (data / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (data / "test.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:8]))
    out = tmp_path / "run"
    flags = [
        "--dataset_name",
        str(data),
        "--prompt_column",
        "question",
        "--max_steps",
        "2",
        "--plot_metrics",
        "false",
    ]
    flags += ["--eval_strategy", "steps", "--eval_steps", "2"]
    result = launch_tiny(tiny_model, out, 29790, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "using the 'train' split (train: train.jsonl; test: test.jsonl)" in result.stdout
    steps = synced_steps(out)
    assert len(steps) == 2
    # 2 steps x 2 ranks x 1 prompt group of the 32 training rows (with the 8 test rows it would be 40).
    assert steps[-1]["epoch"] == pytest.approx(2 * 2 / 32)
    assert all("rewards/accuracy_reward/mean" in row for row in steps)
    history = json.loads((out / "log_history.json").read_text())
    evals = [row for row in history if "eval_rewards/accuracy_reward/mean" in row]
    assert [row["step"] for row in evals] == [2]
    assert "eval_rewards/vowel_fraction/mean" in evals[0]


def test_cli_trains_a_model_without_a_chat_template_on_plain_text_prompts(tiny_model, tmp_path):
    """`prompt_format: auto` picks plain text when the tokenizer has no chat template (chat prompts would fail at the
    first step); the run trains and syncs as usual."""
    import shutil

    base = tmp_path / "base-model"
    shutil.copytree(tiny_model, base)
    (base / "chat_template.jinja").unlink()
    out = tmp_path / "run"
    flags = ["--model_name_or_path", str(base), "--max_steps", "2", "--plot_metrics", "false"]
    result = launch_tiny(tiny_model, out, 29792, *flags)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = synced_steps(out)
    assert len(steps) == 2 and all(row["sync/probe_max_logprob_diff"] < 1e-4 for row in steps)
