"""Run under torchrun: build the colocated engine on the tiny model, generate, push changed weights, verify.

Writes a JSON report per rank to $REPORT_DIR/rank{N}.json; the pytest side asserts on it.
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from colocate_grpo.engine.colocated import ColocatedEngine, SamplingConfig, configure_cpu_runtime
from colocate_grpo.weight_sync import SyncProbe, weight_source


# One straight script, longer than ~60 lines on purpose: it reads top to bottom in the order its report is written.
def main(model_dir: str, tp: int, report_dir: str, sleep: bool = False) -> None:
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    configure_cpu_runtime(int(os.environ.get("LOCAL_WORLD_SIZE", world)), kv_cache_gb=1)
    from transformers import AutoModelForCausalLM

    torch.set_float32_matmul_precision("high")
    torch.manual_seed(99)
    rng_before = torch.get_rng_state()
    engine = ColocatedEngine(
        model_dir,
        tensor_parallel_size=tp,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        max_num_seqs=16,
        enable_sleep_mode=sleep,
        gpu_memory_utilization=0.2,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if on_gpu:
        model = model.cuda()
    probe = SyncProbe(list(range(100, 140)), tolerance=1e-3)
    report = {"rank": rank, "world": world, "tp": tp}
    report["diff_initial"] = probe.measure(model, engine)

    # vLLM reseeds every global RNG and resets the matmul precision; the engine hands the trainer's back.
    report["rng_preserved"] = torch.equal(torch.get_rng_state(), rng_before)
    report["matmul_precision"] = torch.get_float32_matmul_precision()
    # Seeded calls: the same base seed draws the same tokens (ranks of a TP group agree without shared RNG state),
    # another base seed other tokens; repeated prompts in one call still get distinct samples.
    seeded = [
        engine.generate([[1, 7, 7]] * 4, SamplingConfig(max_tokens=12, seed=s)).completion_ids
        for s in (5, 5, 6)
    ]
    report["seeded_same"] = seeded[0] == seeded[1]
    report["seeded_other"] = seeded[0] != seeded[2]
    report["repeats_distinct"] = len({tuple(c) for c in seeded[0]}) > 1
    report["seeded_ids"] = engine.generate_all(
        [[1, 7, 7]] * 4, SamplingConfig(max_tokens=12, seed=5)
    ).completion_ids
    report["rng_preserved_after_generate"] = torch.equal(torch.get_rng_state(), rng_before)
    # Rank r asks for prompts tagged with its own rank so slices can be checked on the pytest side.
    prompts = [[1, 500 + rank, 600 + i] for i in range(3)]
    out = engine.generate(prompts, SamplingConfig(max_tokens=8, temperature=1.0))
    report["prompt_ids"] = out.prompt_ids
    report["completion_lens"] = [len(c) for c in out.completion_ids]
    report["logprobs_finite"] = all(torch.isfinite(torch.tensor(lp)).all().item() for lp in out.logprobs)
    report["logprob_lens_match"] = [len(a) == len(b) for a, b in zip(out.logprobs, out.completion_ids)]

    engine.sleep(level=1)  # sleep mode (GPU): the push below must wake the weights, the probe the KV cache
    # Change every weight identically on all ranks (same seed), including the tied embedding/lm_head.
    torch.manual_seed(1234)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    report["diff_before_push"] = probe.measure(model, engine)
    n, nbytes = engine.load_weights(weight_source(model))
    report["pushed"] = [n, nbytes]
    report["diff_after_push"] = probe.measure(model, engine)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sleep=len(sys.argv) > 4 and sys.argv[4] == "sleep")
