"""Shared fixtures: the tiny random model (built once, offline) and helpers to launch real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / ".cache" / "models"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from colocate_grpo.assets import prepare_tiny

    return prepare_tiny(MODELS)


def run_cmd(cmd: list[str], timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a real launcher command from the repo root; fail with its output tail if it times out."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env)


def bin_path(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def read_reports(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank*.json"))]


def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped, with a reason, where there is no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
