"""Launch real processes from the repository root (torchrun, accelerate, python workers) and read their reports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".cache" / "models"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_cmd(cmd: list[str], timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a real launcher command from the repo root; fail with its output tail if it times out."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def read_reports(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def launch_tiny(tiny_model, out, port: int, *flags: str, config: str = "accelerate_configs/cpu.yaml"):
    """`accelerate launch` (2 CPU processes) of the tiny test recipe, with extra CLI flags."""
    return run_cmd(
        [
            bin_path("accelerate"),
            "launch",
            "--config_file",
            config,
            "--main_process_port",
            str(port),
            "-m",
            "colocate_grpo",
            "--config",
            "recipes/tiny/colocate_test.yaml",
            "--model_name_or_path",
            str(tiny_model),
            "--output_dir",
            str(out),
            *flags,
        ],
        timeout=600,
    )


def synced_steps(out: Path) -> list[dict]:
    """The logged rows of a finished run's `log_history.json` that carry a sync (one per optimizer step)."""
    history = json.loads((Path(out) / "log_history.json").read_text())
    return [row for row in history if "sync/probe_max_logprob_diff" in row]
