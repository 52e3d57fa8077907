"""The real server on loopback for tests, and training commands that use it."""

from __future__ import annotations

import subprocess
import sys

from colocate_grpo.server.app import spawn_server

from .launch import bin_path, free_port

__all__ = ["free_port", "start_server", "stop", "train_cmd"]


def start_server(model, port: int, *flags: str, log=None) -> subprocess.Popen:
    """The real server on loopback, small and single-threaded; returns once /health answers."""
    small = ["--enforce-eager", "--max-model-len", "512", "--kv-cache-gb", "1", "--cpu-threads", "1"]
    small += ["--dtype", "float32"]  # the same precision on every CPU (unset picks bf16 where it is native)
    return spawn_server(model, port, *small, *flags, log=log)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


def train_cmd(tiny_model, out, url: str, *flags: str, processes: int = 2, config: str = "cpu") -> list[str]:
    """A training run of the tiny recipe in server mode: accelerate (2 processes, `accelerate_configs/<config>.yaml`)
    or plain python (1 process)."""
    recipe = ["--config", "recipes/tiny/colocate_test.yaml", "--model_name_or_path", str(tiny_model)]
    args = [*recipe, "--output_dir", str(out), "--vllm_mode", "server", "--vllm_server_base_url", url, *flags]
    if processes == 1:
        return [sys.executable, "-m", "colocate_grpo", *args]
    launcher = [bin_path("accelerate"), "launch", "--config_file", f"accelerate_configs/{config}.yaml"]
    return [*launcher, "--main_process_port", str(free_port()), "-m", "colocate_grpo", *args]
