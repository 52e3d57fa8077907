"""Sync verification in every precision: the exact weight digest and the dtype-aware logprob probe."""

import pytest
import torch

from colocate_grpo.weight_sync.digest import finish, group_of, mismatched_groups, tensor_digest
from colocate_grpo.weight_sync.probe import probe_settings
from tests.helpers.launch import bin_path, read_reports, run_cmd


def _digest(*tensors, dtype=None):
    return finish({"g": sum(tensor_digest(t, dtype) for t in tensors)})["g"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_digest_is_the_same_for_stacked_sharded_and_padded_storage(dtype):
    """What vLLM does to a checkpoint tensor (stack q/k/v, shard over TP ranks, zero-pad a vocabulary) keeps the
    digest, while one element one ulp off changes it."""
    torch.manual_seed(0)
    q, k, v = torch.randn(64, 32), torch.randn(16, 32), torch.randn(16, 32)
    sent = _digest(q, k, v, dtype=dtype)  # the trainer hashes what it sends, cast to the engine dtype
    stacked = torch.cat([q, k, v]).to(dtype)
    assert _digest(stacked) == sent
    assert _digest(*stacked.chunk(4, dim=0)) == sent  # column-parallel shards
    assert _digest(*stacked.chunk(2, dim=1)) == sent  # row-parallel shards
    assert _digest(torch.cat([stacked, torch.zeros(8, 32, dtype=dtype)])) == sent  # zero-padded rows
    nudged = stacked.clone()
    nudged.view(torch.int16 if dtype != torch.float32 else torch.int32)[3, 5] += 1  # one ulp
    assert _digest(nudged) != sent
    swapped = stacked.clone()  # +1 ulp here and -1 ulp there keeps the plain sum: the square sum still moves
    bits = swapped.view(torch.int16 if dtype != torch.float32 else torch.int32)
    bits[0, 0] += 1
    bits[1, 1] -= 1
    assert _digest(swapped) != sent


def test_digest_groups_and_mismatch_report():
    assert group_of("model.layers.3.self_attn.qkv_proj.weight") == "model.layers.3.self_attn"
    assert group_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn"
    assert group_of("lm_head.weight") == ""
    expected = {"model": (1, 2), "model.layers.0.mlp": (3, 4)}
    assert mismatched_groups(expected, dict(expected)) == []
    assert mismatched_groups(expected, {**expected, "model.layers.0.mlp": (3, 5)}) == ["model.layers.0.mlp"]
    # Groups that do not line up (an engine naming its modules differently) fall back to the totals.
    assert mismatched_groups(expected, {"x": (4, 6)}) == []
    assert mismatched_groups(expected, {"x": (4, 7)}) == ["<all weights>"]


def test_probe_statistic_and_tolerance_follow_the_real_dtypes():
    assert probe_settings(torch.float32, torch.float32) == ("max", 1e-3)
    # A float32 trainer measures 16-bit rounding's own error at the same weights: the engine is judged against it.
    assert probe_settings(torch.bfloat16, torch.float32) == ("ratio", 4.0)
    assert probe_settings(torch.float16, torch.float32) == ("ratio", 4.0)
    # A 16-bit trainer has no higher-precision reference: a fixed tolerance on the mean.
    assert probe_settings(torch.float32, torch.bfloat16) == ("mean", 0.5)
    assert probe_settings(torch.bfloat16, torch.bfloat16) == ("mean", 0.5)
    assert probe_settings(torch.float16, torch.float16) == ("mean", 0.1)


@pytest.mark.parametrize(
    "engine_dtype, trainer_dtype, nproc",
    [
        ("float32", "float32", 1),
        ("bfloat16", "float32", 1),
        ("float16", "float32", 1),
        ("bfloat16", "float32", 2),
    ],
    ids=["fp32", "bf16-engine", "fp16-engine", "bf16-engine-tp2"],
)
def test_sabotaged_syncs_are_caught_within_one_step_in_every_precision(
    tiny_model, tmp_path, engine_dtype, trainer_dtype, nproc
):
    """AdamW at the default recipe's lr (2e-5): correct syncs never alarm; a skipped, partial (one mid-network
    tensor dropped) or wrong-valued (one tensor from before the step) sync is caught by the digest at that very
    step, naming the layer; swapped same-shaped tensors (invisible to an order-free hash) by the probe."""
    result = run_cmd(
        [
            bin_path("torchrun"),
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(29850 + nproc),
            "tests/workers/verify_worker.py",
            str(tiny_model),
            str(tmp_path),
            engine_dtype,
            trainer_dtype,
            str(nproc),
            "4",
        ],
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for report in read_reports(tmp_path):
        assert report["engine_dtype"] == f"torch.{engine_dtype}"  # read back from the engine
        outcomes = dict((kind, outcome) for kind, outcome in report["outcomes"] if kind != "correct")
        assert outcomes == {"skipped": "digest", "partial": "digest", "wrong": "digest", "swapped": "probe"}
        assert all(outcome == "none" for kind, outcome in report["outcomes"] if kind == "correct")
        assert "model.layers.1.mlp" in report["messages"]["partial"]  # the dropped down_proj's layer
        assert "model.layers.1.mlp" in report["messages"]["wrong"]
        # Every correct sync sits far inside the tolerance of its statistic (no false alarm near the edge): an
        # absolute difference at a quarter of it, the ratio to bf16/fp16 rounding's own error (about 1) at half.
        values = report[f"probe_{report['statistic']}"]
        assert max(values) < report["tolerance"] / (2 if report["statistic"] == "ratio" else 4)
