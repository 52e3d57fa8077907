"""Server mode in real trainings: 1- and 2-process runs (plain and FSDP2) against a real server; a missing or killed
server stops every trainer rank with a clear error within the timeouts."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from colocate_grpo.server.client import ServerClient
from tests.helpers.launch import ROOT, run_cmd, synced_steps
from tests.helpers.server import free_port, start_server, train_cmd

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("processes,config", [(1, "cpu"), (2, "cpu"), (2, "fsdp2_cpu")])
def test_training_in_server_mode_syncs_and_probes_every_step(server, tiny_model, tmp_path, processes, config):
    out = tmp_path / "run"
    flags = ["--weight_sync_bucket_mb", "4"]  # several buckets per sync
    result = run_cmd(train_cmd(tiny_model, out, server, *flags, processes=processes, config=config))
    assert result.returncode == 0, result.stderr[-4000:]
    steps = synced_steps(out)
    assert len(steps) == 3
    assert all(row["sync/probe_max_logprob_diff"] < 1e-4 for row in steps)
    assert all(row["sync/bytes"] > 0 for row in steps)
    # Each rank trained on its own samples: 3 steps x `processes` groups of the 64-prompt dataset.
    assert steps[-1]["epoch"] == pytest.approx(3 * processes / 64)
    if config == "fsdp2_cpu":  # a sharded source: every rank gathers, rank 0 sends
        assert steps[-1]["sync/local_param_fraction"] == pytest.approx(0.5, abs=0.05)
    # The server generated with the synced weights: its sampling logprobs match the trainer's for the same tokens
    # (float32 on both sides, so TRL's importance-sampling pass is skipped and this trainer's own metric reports it).
    assert all(row["sampling/train_inference_abs_logprob_diff"] < 1e-4 for row in steps)
    assert "sampling/importance_sampling_ratio/mean" not in steps[0]


def test_trainer_without_server_stops_every_rank_with_clear_error(tiny_model, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    result = run_cmd(train_cmd(tiny_model, tmp_path / "run", url, "--vllm_server_timeout", "3"), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"No colocate_grpo vLLM server answered at {url}/health within 3 s" in output
    assert "[rank 1] No colocate_grpo vLLM server answered" in output  # the other rank stopped with it
    assert time.monotonic() - start < 120


def test_server_killed_mid_run_stops_every_rank_within_timeout(tiny_model, tmp_path):
    port = free_port()
    with open(tmp_path / "server.log", "w") as log:
        server = start_server(tiny_model, port, log=log)
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    flags = ["--max_steps", "200", "--vllm_server_request_timeout", "10", "--vllm_server_retries", "2"]
    cmd = train_cmd(tiny_model, tmp_path / "run", url, *flags)
    trainer = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    client = ServerClient(url, request_timeout=10)
    deadline = time.monotonic() + 300
    while client.get_server_info()["weights_version"] < 3:  # a few steps trained through the server
        assert trainer.poll() is None and time.monotonic() < deadline, "trainer did not get going"
        time.sleep(0.2)
    server.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        output, _ = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    server.wait()
    # Connection refused: 3 attempts with 1 s + 2 s back-off, then every rank raises (well inside the 10 s timeout).
    assert time.monotonic() - killed < 60
    assert trainer.returncode != 0
    assert f"vLLM server at {url} did not answer" in output
    assert f"[rank 1] vLLM server at {url} did not answer" in output
    assert "colocate_grpo.serve` is still running" in output
