"""GPU-only: the same engine checks on CUDA (nccl), including sleep mode (level 1: weights offloaded, never
reloaded from disk after a sync). Run with `pytest -m gpu tests/gpu` on a CUDA machine."""

import pytest
import torch

from tests.helpers.launch import bin_path, read_reports, run_cmd

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("sleep", [False, True])
def test_engine_on_gpu_push_and_probe(tiny_model, tmp_path, sleep):
    nproc = min(2, torch.cuda.device_count())
    args = [str(tiny_model), str(nproc), str(tmp_path)] + (["sleep"] if sleep else [])
    result = run_cmd(
        [bin_path("torchrun"), "--nproc_per_node", str(nproc), "tests/workers/engine_worker.py", *args]
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for r in read_reports(tmp_path):
        assert r["prompt_ids"] == [[1, 500 + r["rank"], 600 + i] for i in range(3)]
        assert r["diff_before_push"] > 1e-2
        # After sleep/wake the engine must still serve the pushed weights, not the checkpoint's.
        assert r["diff_after_push"] < 1e-3
