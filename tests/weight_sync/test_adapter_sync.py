"""Adapter-only LoRA sync: the frozen base goes to the engine once, then only the LoRA factors, in memory."""

import json

from tests.helpers.launch import bin_path, run_cmd


def test_adapter_only_sync_serves_the_live_adapter_and_moves_megabytes(tiny_model, tmp_path):
    report_path = tmp_path / "report.json"
    result = run_cmd(
        [bin_path("python"), "tests/workers/adapter_worker.py", str(tiny_model), str(report_path)],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    r = json.loads(report_path.read_text())
    assert r["probe_stale"] > 1e-2  # a changed adapter that was not pushed is visible to the probe
    assert len(r["probe"]) == 2 and max(r["probe"]) < 1e-4  # after each push the engine matches PEFT
    assert r["trainer_lora_b_untouched"]  # vLLM rescales lora_B in place: it must get a copy
    first, second = r["bytes"]
    assert first > r["merged_bytes"]  # first sync: base weights + adapter
    assert second < 0.05 * r["merged_bytes"]  # later syncs: the adapter only
    assert r["generated"] == 4
    # Sleep mode (vLLM's calls recorded): an adapter-only sync wakes the weights before it touches the adapter slots
    # (which live with them), and a level-2 sleep refuses to generate until every discarded weight is reloaded.
    sleep = r["sleep"]
    assert sleep["adapter_step"][0] == ["sleep", 1]  # release() after generation; level 1: the base is frozen
    assert sleep["adapter_step"][1] == ["wake", ["weights"]]  # load_adapter, before installing the adapter
    assert "discarded by a level-2 sleep" in sleep["generate_after_level2"]
    assert "discarded by a level-2 sleep" in sleep["generate_after_partial_reload"]
    assert sleep["generated_after_reload"]
