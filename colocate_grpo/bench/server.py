"""Benchmark: weight updates into an external `colocate_grpo.serve` server, bucketed vs one parameter per call.

Every variant pushes the same full model, through the same `ServerClient` and HTTP transport, into the same server
(127.0.0.1, this machine), alternating, median of `--repeats`:
- `bucket_<N>MiB`: ours: byte-capped buckets (`--bucket_mb`, default 256, 32 and 4 MiB), one safetensors HTTP
  body (sent straight from the tensors' memory) and one vLLM `load_weights` call per bucket;
- `per_param`: the named baseline: one HTTP call (and one vLLM `load_weights` call) per parameter, the shape of
  TRL's server-mode protocol (`/update_named_param/` once per parameter), carried by the same transport.
Every push ends with the server's re-pack of its CPU kernels and prefix-cache reset, and is followed by the sync
probe against the server: the model is perturbed before each push, so a push that did not land shows up there.

Usage: `python -m colocate_grpo.bench.server --model .cache/models/smollm2-135m`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

PORT = int(os.environ.get("COLOCATE_GRPO_BENCH_PORT", 8732))


def main(argv: list[str] | None = None) -> None:
    from ..server.app import spawn_server
    from ..server.client import ServerClient
    from ..server.wire import split_bucket
    from ..weight_sync.sources import weight_buckets
    from .sync import _load_model, _probe

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=".cache/models/smollm2-135m")
    parser.add_argument("--bucket_mb", type=float, nargs="+", default=[256, 32, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # the server gets the other core
    flags = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--kv-cache-gb", "1"]
    with (args.out / "server_push.server.log").open("w") as log:
        proc = spawn_server(args.model, PORT, *flags, "--cpu-threads", "1", log=log)
    try:
        client = ServerClient(f"http://127.0.0.1:{PORT}", request_timeout=600)
        model, probe = _load_model(args.model), _probe(args.model)
        variants = {f"bucket_{mb:g}MiB": int(mb * (1 << 20)) for mb in args.bucket_mb}
        variants["per_param"] = 1  # 1 byte: every tensor its own message
        result = {name: {"seconds": [], "probe": []} for name in variants}
        for _ in range(args.repeats):
            for name, bucket_bytes in variants.items():
                with torch.no_grad():  # a real change every time, so the probe checks this very push
                    for param in model.parameters():
                        param.add_(torch.randn_like(param) * 1e-3)
                client.bucket_bytes = (
                    bucket_bytes  # the client splits every bucket into messages of at most this
                )
                calls = 2 + sum(len(list(split_bucket(b, bucket_bytes))) for b in weight_buckets(model, None))
                start = time.perf_counter()
                tensors, nbytes = client.push(weight_buckets(model, bucket_bytes))
                result[name]["seconds"].append(time.perf_counter() - start)
                result[name]["probe"].append(probe.measure(model, client))
                result[name].update(tensors=tensors, bytes=nbytes, http_calls=calls)  # + begin, end
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    for row in result.values():
        row["median_s"] = statistics.median(row["seconds"])
    (args.out / "server_push.json").write_text(json.dumps(result, indent=1))
    print(f"\nweight update into the server (127.0.0.1, HTTP), {args.model}, median of {args.repeats}")
    for name, row in result.items():
        print(
            f"{name:<10} {row['median_s']:7.3f} s  {row['http_calls']:4d} HTTP calls  {row['tensors']} tensors  "
            f"{row['bytes'] / 1e6:.0f} MB  {row['bytes'] / row['median_s'] / 1e9:.2f} GB/s  "
            f"probe max {max(row['probe']):.1e}"
        )
    for name in list(result)[:-1]:
        speedup = result["per_param"]["median_s"] / result[name]["median_s"]
        print(f"{name} vs one-parameter-per-call: {speedup:.2f}x")


if __name__ == "__main__":
    main()
