"""Benchmark of the sync verification: the sabotage matrix and what verifying costs, per engine and trainer dtype.

For each (engine dtype, trainer dtype) pair, the default recipe's model (SmolLM2-135M) is trained with AdamW at the
default recipe's learning rate (2e-5) on a language-modelling loss over variants of the probe's own text (the
hardest case for the probe: the policy sharpens on exactly the probe's tokens, and bf16 rounding error grows with
it), and every optimizer
step is followed by the push, digest and probe that `ColocatedGeneration.sync_weights` runs, each timed on its own, into a colocated engine. After
`--correct-steps` correct syncs (false alarms are counted there), each sabotage runs once, each followed by a
correct sync that repairs the engine:
- `skipped`: the engine loads nothing; `partial`: one mid-network tensor (`mlp.down_proj` of the middle layer) is
  dropped; `wrong`: that tensor is loaded with its values from before the step (a stale copy);
- `swapped`: `q_proj` and `o_proj` of the middle layer exchanged (same shape: invisible to an order-free digest).
Reported: which check stopped each sabotage (digest / probe / none) at which step, false alarms, the probe
statistic of correct syncs against its tolerance (median, max), and seconds per sync for the push, the digest and
the probe (median, min, max over the correct syncs).

Usage: `python -m colocate_grpo.bench.verify --model .cache/models/smollm2-135m --correct-steps 30`
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

SABOTAGES = ("skipped", "partial", "wrong", "swapped")


def _sabotaged_load(engine, kind: str, layer: int, stale: dict):
    real = engine.load_buckets
    target = f"model.layers.{layer}.mlp.down_proj.weight"
    pair = {f"model.layers.{layer}.self_attn.{a}_proj.weight": f"model.layers.{layer}.self_attn.{b}_proj.weight"
            for a, b in (("q", "o"), ("o", "q"))}  # fmt: skip

    def edit(bucket):
        for name, tensor in bucket:
            if kind == "partial" and name == target:
                continue
            if kind == "wrong" and name == target:
                tensor = stale[name]
            yield (pair.get(name, name) if kind == "swapped" else name), tensor

    def load(buckets):
        engine.load_buckets = real  # one sync only
        return real(iter(())) if kind == "skipped" else real(list(edit(b)) for b in buckets)

    engine.load_buckets = load


def _timed(metrics: dict, name: str, fn):
    start = time.perf_counter()
    out = fn()
    metrics.setdefault(name, []).append(time.perf_counter() - start)
    return out


def _sync_and_check(
    engine, model, digest, probe, step: int, seconds: dict, correct: dict | None
) -> str | None:
    """One sync as `ColocatedGeneration.sync_weights` does it (push, digest, probe), each part timed into `seconds`;
    returns which check raised (`"digest"`, `"probe"`) or None. `correct`: the result to record probe values in."""
    from ..weight_sync import StaleWeightsError, weight_buckets

    _timed(seconds, "push", lambda: engine.load_buckets(digest.track(weight_buckets(model))))
    try:
        _timed(seconds, "digest", lambda: digest.check(engine, step))
    except StaleWeightsError:
        return "digest"
    try:
        stats = _timed(seconds, "probe", lambda: probe.check(model, engine, step))
    except StaleWeightsError:
        return "probe"
    if correct is not None:
        correct["correct_values"].append(stats[probe.statistic])
        correct["correct_max"].append(stats["max"])
        print(f"[bench_verify] {correct['label']} step {step}: {stats}", flush=True)
    return None


def run(model_dir: str, engine_dtype: str, trainer_dtype: str, correct_steps: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..engine.colocated import ColocatedEngine, configure_cpu_runtime
    from ..weight_sync import SyncProbe, weight_buckets
    from ..weight_sync.digest import DigestCheck
    from ..weight_sync.probe import DEFAULT_PROBE_TEXT, probe_settings

    configure_cpu_runtime(1, kv_cache_gb=1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    engine = ColocatedEngine(
        model_dir, dtype=engine_dtype, max_model_len=512, enforce_eager=True, max_num_seqs=8
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, trainer_dtype))
    statistic, tolerance = probe_settings(engine.dtype, model.dtype)
    probe = SyncProbe.from_text(tokenizer, DEFAULT_PROBE_TEXT, tolerance, statistic, engine.dtype)
    digest = DigestCheck(engine.dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    batch = tokenizer(
        [DEFAULT_PROBE_TEXT.replace("48", str(n)) for n in (12, 30, 48, 64)], return_tensors="pt"
    )
    layer = model.config.num_hidden_layers // 2
    plan = ["correct"] * correct_steps + [k for kind in SABOTAGES for k in (kind, "correct")]
    label = f"{str(engine.dtype).removeprefix('torch.')} engine, {trainer_dtype} trainer"
    result = {"label": label, "statistic": statistic, "tolerance": tolerance,
              "false_alarms": 0, "caught": {}, "correct_values": [], "correct_max": [], "seconds": {}}  # fmt: skip
    for step, kind in enumerate(plan):
        stale = {n: p.detach().clone() for n, p in model.named_parameters() if "down_proj" in n}
        model(**batch, labels=batch["input_ids"]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if kind != "correct":
            _sabotaged_load(engine, kind, layer, stale)
        seconds = result["seconds"] if kind == "correct" else {}
        caught = _sync_and_check(
            engine, model, digest, probe, step, seconds, result if kind == "correct" else None
        )
        if kind == "correct":
            result["false_alarms"] += caught is not None
        else:
            # What the probe alone would have said about this sabotage (the digest usually answered first).
            alone = probe.stats(model, engine)[statistic]
            result["caught"][kind] = (caught or "none", step, alone)
            print(
                f"[bench_verify] {result['label']} step {step} {kind}: {caught}; probe alone {alone:.3g}",
                flush=True,
            )
            engine.load_buckets(digest.track(weight_buckets(model)))  # repair before the next case
            digest.check(engine, step)
    return result


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=".cache/models/smollm2-135m")
    parser.add_argument("--correct-steps", type=int, default=30)
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["float32:float32", "bfloat16:float32"],
        help="ENGINE_DTYPE:TRAINER_DTYPE pairs (a bfloat16 trainer is slow on CPUs without native bf16)",
    )
    args = parser.parse_args(argv)
    rows = []
    for config in args.configs:  # the table so far is printed after each configuration
        rows.append(run(args.model, *config.split(":"), args.correct_steps))
        _table(rows, args.correct_steps)


def _table(rows: list[dict], correct_steps: int) -> None:
    print(
        "\n| engine, trainer | skipped | partial | wrong values | swapped | false alarms | probe statistic, correct "
        "syncs (median [min, max]) | tolerance | max \\|logprob diff\\|, correct syncs | push s | digest s | probe s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        # "caught by (step); what the probe alone measured then"
        cells = [
            f"{r['caught'][k][0]} at step {r['caught'][k][1]}; probe alone {r['caught'][k][2]:.3g}"
            for k in SABOTAGES
        ]
        s = r["seconds"]
        print(
            f"| {r['label']} | "
            + " | ".join(cells)
            + f" | {r['false_alarms']} of {correct_steps + len(SABOTAGES)} | "
            f"{r['statistic']} {_spread(r['correct_values'])} | {r['tolerance']:g} | {_spread(r['correct_max'])} | "
            f"{_spread(s['push'])} | {_spread(s['digest'])} | {_spread(s['probe'])} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
