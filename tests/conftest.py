"""Shared fixtures: the tiny random model (built once, offline) and helpers to launch real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.launch import MODELS
from tests.helpers.server import free_port, start_server


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from colocate_grpo.assets import prepare_tiny

    return prepare_tiny(MODELS)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """A real `python -m colocate_grpo.serve` on loopback with the tiny model; yields its URL."""
    port = free_port()
    log = open(tmp_path_factory.mktemp("server") / "server.log", "w")
    proc = start_server(tiny_model, port, log=log)
    yield f"http://127.0.0.1:{port}"
    proc.kill()
    proc.wait(timeout=30)
    log.close()


def pytest_collection_modifyitems(config, items):
    """GPU tests are skipped, with a reason, where there is no CUDA device."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
