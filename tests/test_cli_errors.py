"""Through the CLI (`colocate_grpo.cli.main`, what `python -m colocate_grpo` runs): inputs that used to fail only
after the model and the engine loaded, or silently did the wrong thing, now stop in the first seconds with one line
naming the field and the fix. Each case has a control that the same command without the mistake gets past it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from colocate_grpo.cli import main, parse
from tests.helpers.launch import ROOT


def tiny_args(tiny_model, tmp_path, *flags: str) -> list[str]:
    recipe = ["--config", "recipes/tiny/colocate_test.yaml", "--model_name_or_path", str(tiny_model)]
    return [*recipe, "--output_dir", str(tmp_path / "run"), *flags]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--learning_rate", "0"], "learning_rate must be > 0, got 0.0"),
        (["--learning_rate=-1e-6"], "learning_rate must be > 0"),
        (["--temperature", "0"], "temperature must be > 0"),
        (["--top_p", "1.5"], "top_p must be in"),
        (["--max_steps", "0"], "max_steps=0"),
        (["--num_generations", "1", "--per_device_train_batch_size", "1"], "num_generations >= 2"),
        (["--learning_rat", "0.1"], "unknown option(s): --learning_rat (did you mean --learning_rate?)"),
        (
            ["--resume_from_checkpoint", "true"],
            "resume_from_checkpoint=true: no complete checkpoint-* folder",
        ),
        (
            ["--dataset_name", "./no/such/data.jsonl"],
            "dataset_name=./no/such/data.jsonl: no such file or folder",
        ),
    ],
)
def test_bad_input_stops_before_anything_loads(tiny_model, tmp_path, flags, message):
    with pytest.raises(SystemExit) as stop:
        main(tiny_args(tiny_model, tmp_path, *flags))
    assert message in str(stop.value)
    assert str(stop.value).startswith("colocate_grpo: ")


def test_control_the_same_command_without_the_mistake_parses(tiny_model, tmp_path):
    script, args, _ = parse(tiny_args(tiny_model, tmp_path, "--learning_rate", "0.1", "--top_p", "0.9"))
    assert args.learning_rate == 0.1 and args.top_p == 0.9 and args.resume_from_checkpoint is None


def test_resume_true_from_the_command_line_means_the_latest_complete_checkpoint(tiny_model, tmp_path):
    """The CLI's `true` is the YAML's `true`: the newest checkpoint with trainer_state.json (written last by the
    Trainer), never a half-written one."""
    complete, torn = tmp_path / "run" / "checkpoint-1", tmp_path / "run" / "checkpoint-2"
    torn.mkdir(parents=True)
    with pytest.raises(SystemExit, match="no complete checkpoint-\\* folder"):  # only an interrupted save
        parse(tiny_args(tiny_model, tmp_path, "--resume_from_checkpoint", "true"))
    complete.mkdir()
    (complete / "trainer_state.json").write_text("{}")
    _, args, _ = parse(tiny_args(tiny_model, tmp_path, "--resume_from_checkpoint", "true"))
    assert args.resume_from_checkpoint == str(complete)
    (torn / "trainer_state.json").write_text("{}")  # control: once complete, the newer one is picked
    _, args, _ = parse(tiny_args(tiny_model, tmp_path, "--resume_from_checkpoint", "true"))
    assert args.resume_from_checkpoint == str(torn)
    with pytest.raises(SystemExit, match="not a complete checkpoint"):
        parse(tiny_args(tiny_model, tmp_path, "--resume_from_checkpoint", str(tmp_path)))


def test_a_model_the_cpu_engine_cannot_run_is_named_before_loading(tiny_model, tmp_path):
    small = tmp_path / "small-heads"
    small.mkdir()
    config = json.loads((tiny_model / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "num_attention_heads": 8, "head_dim": None}))
    with pytest.raises(SystemExit, match=r"head_dim 16 .* below 64"):
        parse([*tiny_args(tiny_model, tmp_path), "--model_name_or_path", str(small)])
    # Control: the tiny model itself (head_dim 64) passes.
    assert config["hidden_size"] // config["num_attention_heads"] >= 64
    parse(tiny_args(tiny_model, tmp_path))


def test_the_real_command_fails_within_seconds(tiny_model, tmp_path):
    start = time.monotonic()
    cmd = [sys.executable, "-m", "colocate_grpo", *tiny_args(tiny_model, tmp_path, "--learning_rate", "0")]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "colocate_grpo: learning_rate must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - start < 60  # imports only: no model, no engine


def test_evaluation_needs_a_test_split_and_finds_a_folders_test_file(tiny_model, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "1+1?", "answer": "2"}')
    evaluate = ["--dataset_name", str(data), "--eval_strategy", "steps"]
    with pytest.raises(SystemExit, match="has no 'test' split"):
        parse(tiny_args(tiny_model, tmp_path, *evaluate))
    (data / "test.jsonl").write_text('{"question": "2+2?", "answer": "4"}')
    script, args, _ = parse(
        tiny_args(tiny_model, tmp_path, *evaluate)
    )  # control: with the test file, no flag more
    assert args.eval_strategy == "steps" and script.eval_dataset_name is None
