"""Checkpoint, kill -9, resume: through the real launcher on 2 CPU processes, a run killed after a checkpoint and
resumed with `--resume_from_checkpoint true` ends with exactly the weights of the uninterrupted run, and the syncs
after the resume are verified like any other."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from colocate_grpo.preflight import latest_checkpoint
from tests.helpers.launch import ROOT, bin_path, free_port, launch_tiny, synced_steps

pytestmark = pytest.mark.slow

STEPS = 8
FLAGS = [
    "--max_steps",
    str(STEPS),
    "--save_strategy",
    "steps",
    "--save_steps",
    "2",
    "--plot_metrics",
    "false",
]


def killed_after_checkpoint(tiny_model, out, config: str) -> None:
    """Start the run, wait until checkpoint-2 is complete, then SIGKILL every process of it."""
    cmd = [bin_path("accelerate"), "launch", "--config_file", config, "--main_process_port", str(free_port())]
    cmd += ["-m", "colocate_grpo", "--config", "recipes/tiny/colocate_test.yaml"]
    cmd += ["--model_name_or_path", str(tiny_model), "--output_dir", str(out), *FLAGS]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 600
    try:
        while not (out / "checkpoint-2" / "trainer_state.json").is_file():
            assert proc.poll() is None, f"the run ended (rc {proc.returncode}) before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 10 minutes"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "model.safetensors").exists()  # really interrupted before the end


@pytest.mark.parametrize("config", ["cpu", "zero3_cpu"], ids=["ddp", "zero3"])
def test_kill_9_then_resume_ends_with_the_uninterrupted_weights(tiny_model, tmp_path, config):
    accelerate_config = f"accelerate_configs/{config}.yaml"
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    result = launch_tiny(tiny_model, straight, free_port(), *FLAGS, config=accelerate_config)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("'sync/probe_max_logprob_diff'") == STEPS
    assert (straight / "checkpoint-2" / "trainer_state.json").is_file()  # checkpoints are written
    killed_after_checkpoint(tiny_model, resumed, accelerate_config)
    start = int(latest_checkpoint(str(resumed)).name.split("-")[-1])  # what `true` will resume from
    assert start < STEPS, "the kill came after the last checkpoint: nothing left to resume"
    relaunch = time.time()
    result = launch_tiny(tiny_model, resumed, free_port(), *FLAGS, "--resume_from_checkpoint", "true",
                         config=accelerate_config)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    # Resumed, not restarted (a deterministic restart would also end with the same weights): the checkpoint it
    # started from is the killed run's, untouched, where a restart would have written it again.
    assert (resumed / f"checkpoint-{start}" / "trainer_state.json").stat().st_mtime < relaunch
    history = synced_steps(resumed)
    assert [row["step"] for row in history][:STEPS] == list(range(1, STEPS + 1))
    assert all(row["sync/probe_max_logprob_diff"] < 1e-4 for row in history[start:])
    expected, got = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert expected.keys() == got.keys()
    changed = [
        n for n in expected if not torch.equal(expected[n], load_file(tiny_model / "model.safetensors")[n])
    ]
    assert changed, "training changed no weight: the comparison would prove nothing"
    assert [n for n in expected if not torch.equal(expected[n], got[n])] == []
