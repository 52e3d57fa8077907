"""Sharded trainings through the real launcher (FSDP1, FSDP2, ZeRO-3 on 2 CPU processes, full and LoRA): every
sync is verified and the policy really is sharded."""

from __future__ import annotations

import pytest

from tests.helpers.launch import launch_tiny, synced_steps

pytestmark = pytest.mark.slow

BACKENDS = ["fsdp1", "fsdp2", "zero3"]


@pytest.mark.parametrize("lora", [None, "merged", "adapter"], ids=["full", "lora-merged", "lora-adapter"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sharded_training_run_verifies_every_sync(tiny_model, tmp_path, backend, lora):
    out = tmp_path / "run"
    flags = ["--weight_sync_bucket_mb", "4"]
    if lora:
        flags += ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--learning_rate", "5e-2"]
        flags += ["--lora_target_modules", "q_proj", "v_proj", "up_proj", "--weight_sync_lora_mode", lora]
    port = 29850 + 3 * BACKENDS.index(backend) + [None, "merged", "adapter"].index(lora)
    result = launch_tiny(tiny_model, out, port, *flags, config=f"accelerate_configs/{backend}_cpu.yaml")
    assert result.returncode == 0, result.stderr[-4000:]
    steps = synced_steps(out)
    assert len(steps) == 3
    assert all(row["sync/probe_max_logprob_diff"] < 1e-4 for row in steps)
    assert all(row["sync/local_param_fraction"] == pytest.approx(0.5, abs=0.05) for row in steps)
    assert steps[-1]["epoch"] == pytest.approx(3 * 2 / 64)  # 2 real ranks
    saved = "adapter_model.safetensors" if lora else "model.safetensors"
    assert (out / saved).stat().st_size > 0
    if lora == "adapter":  # the base goes once; afterwards a sync moves only the adapter
        assert all(row["sync/bytes"] < 0.05 * steps[0]["sync/bytes"] for row in steps[1:])
    if (
        lora == "merged"
    ):  # frozen tensors go once; afterwards only the LoRA-merged layers (and the probe agrees)
        assert all(row["sync/bytes"] < 0.5 * steps[0]["sync/bytes"] for row in steps[1:])
