"""Run under torchrun: the sync verification (digest + probe) against sabotaged syncs, in a given precision.

A real policy (the tiny model) is trained with AdamW on a language-modelling loss at the default recipe's learning
rate; after each optimizer step `ColocatedGeneration.sync_weights` pushes and verifies, exactly as in training. Some
syncs are sabotaged at the sink: skipped (nothing loaded), partial (one mid-network tensor dropped), wrong values
(one tensor loaded from before the step) and swapped (q_proj and o_proj of every layer exchanged: same shapes, same
per-layer digest). Writes, per
rank, which check (digest / probe / none) stopped each sync, to $REPORT_DIR/rank{N}.json.

Usage: torchrun ... verify_worker.py MODEL_DIR REPORT_DIR ENGINE_DTYPE TRAINER_DTYPE TP CORRECT_STEPS
"""

import json
import os
import sys

import torch
import torch.distributed as dist

from colocate_grpo.engine.colocated import ColocatedEngine, SamplingConfig, configure_cpu_runtime
from colocate_grpo.trainer.generation import ColocatedGeneration
from colocate_grpo.weight_sync import StaleWeightsError, SyncProbe
from colocate_grpo.weight_sync.digest import DigestCheck
from colocate_grpo.weight_sync.probe import DEFAULT_PROBE_TEXT, probe_settings


def sabotage(engine, kind: str, layer: int, stale: dict):
    """Wrap `engine.load_buckets` so that the next sync misbehaves as `kind` says."""
    real = engine.load_buckets
    target = f"model.layers.{layer}.mlp.down_proj.weight"

    def edit(bucket):
        out = []
        for name, tensor in bucket:
            if kind == "partial" and name == target:
                continue
            if kind == "wrong" and name == target:
                tensor = stale[name]
            if kind == "swapped" and name.endswith(("self_attn.q_proj.weight", "self_attn.o_proj.weight")):
                name = (
                    name.replace("q_proj", "o_proj") if "q_proj" in name else name.replace("o_proj", "q_proj")
                )
            out.append((name, tensor))
        return out

    def load(buckets):
        engine.load_buckets = real
        if kind == "skipped":
            return real(iter(()))
        return real(edit(b) for b in buckets)

    engine.load_buckets = load


# One straight script, longer than ~60 lines on purpose: it reads top to bottom in the order its report is written.
def main(model_dir, report_dir, engine_dtype, trainer_dtype, tp, correct_steps):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    configure_cpu_runtime(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), kv_cache_gb=1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = ColocatedEngine(
        model_dir,
        tensor_parallel_size=tp,
        dtype=engine_dtype,
        max_model_len=256,
        enforce_eager=True,
        max_num_seqs=8,
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, trainer_dtype))
    statistic, tolerance = probe_settings(engine.dtype, model.dtype)
    probe = SyncProbe.from_text(tokenizer, DEFAULT_PROBE_TEXT, tolerance, statistic, engine.dtype)
    metrics = {}
    report = {
        "engine_dtype": str(engine.dtype),
        "statistic": statistic,
        "tolerance": tolerance,
        "outcomes": [],
    }
    gen = ColocatedGeneration(
        model, engine, SamplingConfig(max_tokens=4), probe, digest=DigestCheck(engine.dtype)
    )
    gen.bind(lambda name, value: metrics.setdefault(name, []).append(value), lambda: len(report["outcomes"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)  # the default recipe's learning rate
    torch.manual_seed(0)  # same data and so the same weights on every rank
    batch = torch.randint(0, len(tokenizer), (4, 32))
    layer = model.config.num_hidden_layers // 2
    plan = ["correct"] * correct_steps + [
        "skipped",
        "correct",
        "partial",
        "correct",
        "wrong",
        "correct",
        "swapped",
    ]
    for kind in plan:
        stale = {n: p.detach().clone() for n, p in model.named_parameters() if "down_proj" in n}
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if kind != "correct":
            sabotage(engine, kind, layer, stale)
        try:
            gen.sync_weights()
            outcome = "none"
        except StaleWeightsError as exc:
            outcome = "digest" if "digest failed" in str(exc) else "probe"
            report.setdefault("messages", {})[kind] = str(exc)
            gen.sync_weights()  # a correct sync repairs the engine before the next case
        report["outcomes"].append([kind, outcome])
    report["probe_mean"] = metrics["sync/probe_mean_logprob_diff"]
    report["probe_max"] = metrics["sync/probe_max_logprob_diff"]
    report["probe_ratio"] = metrics.get("sync/probe_ratio")
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
