"""Weight-sync benchmark: bucketed sync vs a per-parameter baseline vs the memcpy bound, per training backend.

Runs 2 CPU ranks (torchrun, gloo, one thread per rank, as in training) on the CPU recipe's model and measures, for
each backend (DDP, FSDP1, FSDP2, ZeRO-3), in the same run:
- `bucketed`: our sync, source -> engine `load_weights`, buckets of `--bucket_mb` (the default setting);
- `collective`: the same buckets gathered with gloo collectives instead of host shared memory (what a multi-host
  CPU run, or NCCL on GPU, uses);
- `per_param`: the same engine load, but gathering one parameter at a time (TRL's strategy: one
  `GatheredParameters([p])` / `full_tensor()` / FSDP1 unit per gather);
- `gather_only` for both (the source drained into preallocated memory, no engine), to separate the collective
  from the engine's load + CPU kernel repacking;
- `memcpy`: copying the same bytes between preallocated CPU tensors, the physical bound of any sync here.
A second pass (no engine) measures the peak extra RSS of a sync for several bucket sizes; a third compares LoRA
merge-then-sync with adapter-only sync (bytes and seconds).

Usage: `python -m colocate_grpo.bench.sync --model .cache/models/smollm2-135m` (also run by `make bench`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ..weight_sync.sharding import BACKENDS, shard_model

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _median_seconds(fn, repeats: int) -> float:
    import torch.distributed as dist

    times = []
    for _ in range(repeats):
        dist.barrier()  # both ranks start together, as they do in training
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _load_model(path: str, lora: bool = False):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():  # a real change, so every sync is checked by the probe against new weights
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 1e-3)
    return model


def _drain(model, bucket_bytes, sink: dict[str, torch.Tensor], shm: bool = True) -> None:
    from ..weight_sync import weight_source

    for name, tensor in weight_source(model, bucket_bytes, shm=shm):
        sink[name].copy_(tensor)


def _engine(model_path: str, lora: dict | None = None):
    from ..engine.colocated import ColocatedEngine

    return ColocatedEngine(
        model_path, dtype="float32", max_model_len=512, enforce_eager=True, max_num_seqs=8, lora=lora
    )


def _probe(model_path: str):
    from transformers import AutoTokenizer

    from ..weight_sync.probe import DEFAULT_PROBE_TEXT, SyncProbe

    return SyncProbe.from_text(AutoTokenizer.from_pretrained(model_path), DEFAULT_PROBE_TEXT, 1e-3)


def _time_variants(engine, model, bucket: int, full: dict, copies: dict, repeats: int) -> dict:
    from ..weight_sync import weight_source
    from ..weight_sync.sources import weight_buckets

    timed = {
        "bucketed": lambda: engine.load_buckets(weight_buckets(model, bucket)),
        "bucketed_collective": lambda: engine.load_buckets(weight_buckets(model, bucket, shm=False)),
        # TRL's colocate sync: gather one parameter, one `load_weights([(name, param)])` call, next parameter.
        "per_param": lambda: engine.load_weights(weight_source(model, None)),
        "gather_bucketed": lambda: _drain(model, bucket, copies),
        "gather_bucketed_collective": lambda: _drain(model, bucket, copies, shm=False),
        "gather_per_param": lambda: _drain(model, None, copies),
        "memcpy": lambda: [copies[n].copy_(t) for n, t in full.items()],
    }
    return {f"{key}_s": _median_seconds(fn, repeats) for key, fn in timed.items()}


def _sync_pass(args) -> dict:
    from ..weight_sync.sources import weight_buckets

    engine, probe, results = _engine(args.model), _probe(args.model), {}
    bucket = int(args.bucket_mb * 2**20)
    for backend in args.backends:
        model = _load_model(args.model)
        full = {n: p.detach().clone() for n, p in model.named_parameters()}
        copies = {n: torch.empty_like(t) for n, t in full.items()}
        model = shard_model(model, backend)
        nbytes = engine.load_buckets(weight_buckets(model, bucket))[1]  # first sync (+ warm-up)
        row = {"bytes": nbytes, "probe_diff": probe.measure(model, engine)}
        row.update(_time_variants(engine, model, bucket, full, copies, args.repeats))
        row["probe_diff_after"] = probe.measure(model, engine)
        results[backend] = row
        del model
    return results


def _memory_pass(args) -> dict:
    from ..weight_sync.shm import release_host_buffers

    def status(key: str) -> float:
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # kB -> MiB
        raise RuntimeError(key)

    results = {}
    for backend in args.backends:
        model = _load_model(args.model)
        copies = {n: p.detach().clone() for n, p in model.named_parameters()}
        model = shard_model(model, backend)
        _drain(model, 1 << 20, copies)
        row = {}
        for mb in (16, 64, 256, 1 << 20):
            release_host_buffers()  # each measured sync builds its own shared buffer, as the first sync does
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset this process's RSS high-water mark
            start = status("VmRSS:")
            _drain(model, mb * 2**20, copies)
            row["all" if mb == 1 << 20 else str(mb)] = status("VmHWM:") - start
        results[backend] = row
        del model
    return results


def _lora_pass(args) -> dict:
    from ..engine.sampling import SamplingConfig
    from ..trainer.generation import ColocatedGeneration, engine_lora_settings

    model = _load_model(args.model, lora=True)
    engine = _engine(args.model, lora=engine_lora_settings(model))
    results = {}
    for mode in ("merged", "adapter"):
        gen = ColocatedGeneration(
            model, engine, SamplingConfig(max_tokens=1), _probe(args.model), 256 << 20, mode
        )
        metrics: dict[str, list[float]] = {}
        gen.bind(lambda k, v, m=metrics: m.setdefault(k, []).append(v), lambda: 0)
        gen.sync_weights()  # first sync: frozen base weights too
        for _ in range(args.repeats):
            with torch.no_grad():
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.add_(torch.randn_like(p) * 1e-4)
            gen.sync_weights()
        results[mode] = {
            "first_bytes": metrics["sync/bytes"][0],
            "bytes": statistics.median(metrics["sync/bytes"][1:]),
            "seconds": statistics.median(metrics["sync/seconds"][1:]),
            "probe_max": max(metrics["sync/probe_max_logprob_diff"]),
        }
    return results


def _worker(args) -> None:
    import torch.distributed as dist

    from ..engine.colocated import configure_cpu_runtime

    dist.init_process_group("gloo")
    configure_cpu_runtime(int(os.environ.get("LOCAL_WORLD_SIZE", 2)), kv_cache_gb=1)
    result = {"sync": _sync_pass, "memory": _memory_pass, "lora": _lora_pass}[args.worker](args)
    if dist.get_rank() == 0:
        Path(args.out, f"sync_{args.worker}.json").write_text(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=".cache/models/smollm2-135m")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--bucket_mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench"))
    parser.add_argument("--worker", choices=("sync", "memory", "lora"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "DS_SKIP_SHM_OP": "1"}
    # Memory pass only: large buffers must come from (and return to) the OS for RSS to show live memory.
    malloc = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    for i, mode in enumerate(("sync", "memory", "lora")):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"]
        cmd += [str(29650 + i), "-m", "colocate_grpo.bench.sync", "--worker", mode, "--model", args.model]
        cmd += ["--bucket_mb", str(args.bucket_mb), "--repeats", str(args.repeats), "--out", str(args.out)]
        cmd += ["--backends", *args.backends]
        print(f"[bench_sync] {mode}: {' '.join(cmd)}", flush=True)
        with (args.out / f"sync_{mode}.log").open("w") as log:
            run_env = {**env, **malloc} if mode == "memory" else env
            rc = subprocess.run(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=run_env, timeout=1800
            ).returncode
        if rc != 0:
            print(f"[bench_sync] {mode} failed (exit {rc}); see {args.out / f'sync_{mode}.log'}")
    _report(args.out, args.bucket_mb)


def _report(out: Path, bucket_mb: float) -> None:
    def load(mode: str) -> dict:
        path = out / f"sync_{mode}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    sync, memory, lora = load("sync"), load("memory"), load("lora")
    print(
        f"\nweight sync, 2 CPU ranks, bucket {bucket_mb:g} MiB, median seconds (engine load + CPU repack included)"
    )
    print("backend  MB    bucketed  collective  per-param  speedup  | gather only: bucketed collect. per-param"
          "  | memcpy  GB/s  %memcpy  probe")  # fmt: skip
    for backend, r in sync.items():
        print(
            f"{backend:<8} {r['bytes'] / 1e6:4.0f}  {r['bucketed_s']:7.3f}  {r['bucketed_collective_s']:9.3f}  "
            f"{r['per_param_s']:8.3f}  {r['per_param_s'] / r['bucketed_s']:6.2f}x  |  {r['gather_bucketed_s']:8.3f} "
            f"{r['gather_bucketed_collective_s']:8.3f} {r['gather_per_param_s']:8.3f}"
            f"  ({r['gather_per_param_s'] / r['gather_bucketed_s']:5.1f}x)  | {r['memcpy_s']:6.3f}  "
            f"{r['bytes'] / r['bucketed_s'] / 1e9:4.2f}  {100 * r['memcpy_s'] / r['bucketed_s']:5.1f}%  "
            f"{r['probe_diff_after']:.1e}"
        )
    if memory:
        print("\npeak extra RSS during a sync (MiB) by bucket size (MiB)")
        for backend, row in memory.items():
            print(f"{backend:<8} " + "  ".join(f"{k}: {v:6.1f}" for k, v in row.items()))
    if lora:
        print("\nLoRA r=16 on all projections (after the first sync)")
        for mode, r in lora.items():
            print(
                f"{mode:<8} {r['bytes'] / 1e6:8.2f} MB  {r['seconds']:.3f} s  (first sync {r['first_bytes'] / 1e6:.0f} MB, "
                f"probe max {r['probe_max']:.1e})"
            )
        if {"merged", "adapter"} <= lora.keys():
            share = lora["adapter"]["bytes"] / lora["merged"]["bytes"]
            print(f"adapter-only moves {100 * share:.2f}% of the merged bytes (goal < 5%)")


if __name__ == "__main__":
    main()
