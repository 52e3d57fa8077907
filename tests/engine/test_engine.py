"""The colocated engine in real processes (torchrun, gloo): generation slices and verified in-process weight push."""

import pytest

from tests.helpers.launch import bin_path, read_reports, run_cmd


@pytest.mark.parametrize("nproc,tp", [(1, 1), (2, 1), (2, 2)])
def test_engine_generates_slices_and_loads_pushed_weights(tiny_model, tmp_path, nproc, tp):
    result = run_cmd(
        [
            bin_path("torchrun"),
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(29600 + 10 * nproc + tp),
            "tests/workers/engine_worker.py",
            str(tiny_model),
            str(tp),
            str(tmp_path),
        ],
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    reports = read_reports(tmp_path)
    assert [r["rank"] for r in reports] == list(range(nproc))
    for r in reports:
        # Each rank gets back exactly its own prompts (tagged 500 + rank), in order, even when TP pools them.
        assert r["prompt_ids"] == [[1, 500 + r["rank"], 600 + i] for i in range(3)]
        assert all(n > 0 for n in r["completion_lens"])
        assert r["logprobs_finite"] and all(r["logprob_lens_match"])
        # The engine starts on the checkpoint: logprobs agree with HF.
        assert r["diff_initial"] < 1e-4
        # After changing the HF weights and before the push, the engine is stale and the probe sees it ...
        assert r["diff_before_push"] > 1e-2
        # ... and after the in-process push (incl. the tied lm_head and CPU-packed kernels) they match again.
        assert r["diff_after_push"] < 1e-4
        assert r["pushed"][0] > 0 and r["pushed"][1] > 0
        assert r["rng_preserved"] and r["rng_preserved_after_generate"] and r["matmul_precision"] == "high"
        assert r["seeded_same"] and r["seeded_other"] and r["repeats_distinct"]
    if tp == 2:  # explicit per-request seeds: both ranks of one TP group drew the same tokens
        assert reports[0]["seeded_ids"] == reports[1]["seeded_ids"]
    elif nproc == 2:  # separate replicas: the same prompts and base seed still give different samples
        assert reports[0]["seeded_ids"] != reports[1]["seeded_ids"]
