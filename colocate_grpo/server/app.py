"""`python -m colocate_grpo.serve`: the vLLM server for `vllm_mode: server`.

Serves one model over HTTP for one trainer: generation with the same sampling semantics as colocate mode (it runs
the same `ColocatedEngine`), the sync probe's prompt logprobs, prefix-cache reset, and weight updates streamed in
byte-capped buckets (HTTP safetensors bodies, or NCCL broadcasts announced over HTTP; see `server.wire`).

Launch (binds to loopback unless told otherwise; `--host 0.0.0.0` serves other machines):
    python -m colocate_grpo.serve --model .cache/models/smollm2-135m --port 8000
    python -m colocate_grpo.serve --model Qwen/Qwen2.5-7B --tensor-parallel-size 2 --host 0.0.0.0 --port 8000

With `--tensor-parallel-size K > 1` the command re-launches itself under torchrun with K processes; rank 0 answers
HTTP and replays every engine call on the other ranks (they hold the other weight shards), so all ranks run the
same calls in the same order.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
from concurrent.futures import Future
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import ServeArgs
from ..engine.base import ServedEngine
from ..engine.runtime import nccl_group
from . import wire

MAX_BODY_BYTES = 8 << 30  # one bucket; the trainer caps buckets far below this


class EngineHost:
    """The engine plus the state of a weight update in progress; `run(op, payload)` is the only entry point and
    runs on every server rank in the same order (rank 0 replays each call on the others first)."""

    def __init__(self, args: ServeArgs):
        from ..engine.colocated import ColocatedEngine

        self.args = args
        self.engine: ServedEngine = ColocatedEngine(args.model, **args.engine_kwargs())
        self.loaded: set[str] = set()
        self.count = 0
        self.version = 0  # completed weight updates
        self.comm = None  # NCCL group with the trainer (GPU transport)

    def info(self) -> dict:
        return {
            "model": self.args.model,
            "tensor_parallel_size": self.args.tensor_parallel_size,
            "max_model_len": self.engine.max_model_len,
            "dtype": str(self.engine.dtype).removeprefix("torch."),
            "weights_version": self.version,
            "lora": self.args.max_lora_rank is not None,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            # TRL's trainer reads this to check the importance-sampling correction's assumptions.
            "model_config": {"logprobs_mode": "processed_logprobs"},
        }

    def run(self, op: str, payload):
        if op == "generate":
            out = self.engine.generate_all(payload["prompts"], wire.sampling_from_json(payload["sampling"]))
            return {
                "prompt_ids": out.prompt_ids,
                "completion_ids": out.completion_ids,
                "logprobs": out.logprobs,
            }
        if op == "prompt_logprobs":
            return {"logprobs": self.engine.prompt_logprobs(payload["token_ids"]).tolist()}
        if op == "reset_prefix_cache":
            self.engine.reset_prefix_cache()
            return {}
        if op == "weights_digest":
            return {"groups": self.engine.weights_digest()}
        if op == "begin":
            self.loaded, self.count, self.messages = set(), 0, 0
            return {}
        if op == "bucket":
            bucket, _ = wire.unpack_bucket(payload)
            return self._load(bucket)
        if op == "nccl_init":
            rank = 1 + (dist.get_rank() if dist.is_initialized() else 0)
            device = torch.cuda.current_device()
            self.comm = nccl_group(payload["host"], payload["port"], rank, payload["world_size"], device)
            return {}
        if op == "nccl_announce":  # answered before the trainer broadcasts: a rejection here blocks nobody
            self._check_nccl_layout(payload["layout"])
            return {"accepted": True}
        if op == "nccl_bucket":
            return self._receive_nccl(payload["layout"])
        if op == "end":
            self.engine.finish_load(self.loaded, self.count)
            self.version += 1
            return {"weights_version": self.version, "tensors": self.count, "messages": self.messages}
        if op == "adapter":
            tensors, metadata = wire.unpack_bucket(payload)
            nbytes = self.engine.load_adapter(dict(tensors), json.loads(metadata["peft_config"]))
            self.version += 1
            return {"bytes": nbytes, "weights_version": self.version}
        raise ValueError(f"unknown operation {op!r}")

    def _load(self, bucket: wire.Bucket) -> dict:
        self.messages += 1
        self.loaded |= self.engine.load_bucket(bucket)
        self.count += len(bucket)
        return {"tensors": len(bucket), "bytes": sum(t.numel() * t.element_size() for _, t in bucket)}

    def _check_nccl_layout(self, layout: list[dict]) -> None:
        if self.comm is None:
            raise RuntimeError("NCCL weight transport used before /weights/nccl/init.")
        wire.layout_bytes(layout)  # raises on a malformed layout (unknown dtype, bad shape)

    def _receive_nccl(self, layout: list[dict]) -> dict:
        self._check_nccl_layout(layout)
        buffer = torch.empty(wire.layout_bytes(layout), dtype=torch.uint8, device="cuda")
        self.comm.broadcast(buffer, src=0)  # the trainer's main process is rank 0 of the group
        wire.wait_for_stream(600, "NCCL weight bucket receive")
        return self._load(wire.unflatten_bucket(buffer, layout))


# HTTP routes -> (engine operation, how the request body is read)
ROUTES = {
    "/generate": ("generate", "json"),
    "/prompt_logprobs": ("prompt_logprobs", "json"),
    "/reset_prefix_cache": ("reset_prefix_cache", "json"),
    "/weights/begin": ("begin", "json"),
    "/weights/bucket": ("bucket", "bytes"),
    "/weights/end": ("end", "json"),
    "/weights/digest": ("weights_digest", "json"),
    "/weights/adapter": ("adapter", "bytes"),
    "/weights/nccl/init": ("nccl_init", "json"),
    "/weights/nccl/announce": ("nccl_announce", "json"),
    "/weights/nccl/bucket": ("nccl_bucket", "json"),
}


def make_handler(jobs: queue.Queue, info: dict):
    """An HTTP handler class that puts engine work on `jobs` (run by the main thread, one at a time) and waits."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request would drown the trainer's log
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/health", "/info"):
                self._reply(200, {"status": "ok", **info})
            else:
                self._reply(404, {"error": f"no route {self.path}"})

        def do_POST(self):
            route = ROUTES.get(self.path)
            length = int(self.headers.get("Content-Length", 0))
            if route is None or length > MAX_BODY_BYTES:
                self.rfile.read(min(length, MAX_BODY_BYTES))
                self._reply(404 if route is None else 413, {"error": f"bad request to {self.path}"})
                return
            body = bytearray(length)  # read in place: weight tensors are then views into it, not copies
            view, done = memoryview(body), 0
            while done < length:
                got = self.rfile.readinto(view[done:])
                if not got:
                    self._reply(400, {"error": f"body of {self.path} ended after {done} of {length} bytes"})
                    return
                done += got
            op, kind = route
            payload = json.loads(body or b"{}") if kind == "json" else body
            future: Future = Future()
            jobs.put((op, payload, future))
            try:
                result = future.result()
            except Exception as exc:  # the engine's error goes back to the trainer, the server keeps serving
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
                return
            if op in ("end", "adapter"):
                info["weights_version"] = result["weights_version"]
            self._reply(200, result)

    return Handler


def _init_distributed(args: ServeArgs) -> dist.ProcessGroup | None:
    """The server's own torch.distributed world (one process, or the K TP ranks torchrun started); returns the gloo
    group rank 0 replays calls on, or None with one process."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return None  # ColocatedEngine makes a private 1-rank group
    if sys.platform == "linux":  # a rank must not outlive its launcher, even one killed with SIGKILL
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(minutes=30))
    return dist.new_group(
        backend="gloo", timeout=timedelta(days=365)
    )  # followers idle until the next request


def serve(args: ServeArgs) -> None:
    from ..engine.colocated import configure_cpu_runtime

    configure_cpu_runtime(args.tensor_parallel_size, args.kv_cache_gb, args.cpu_threads)
    replay = _init_distributed(args)
    host = EngineHost(args)
    rank = dist.get_rank() if replay is not None else 0
    if rank != 0:  # followers: run whatever rank 0 runs, forever (torchrun stops them with rank 0)
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0, group=replay)
            try:
                host.run(*message[0])
            except Exception as exc:  # rank 0 hits the same error and reports it to the trainer
                print(
                    f"colocate_grpo.serve rank {rank}: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
    # SIGTERM (also what torchrun forwards) exits through atexit, which unlinks the engine's shared memory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    info = host.info()
    jobs: queue.Queue = queue.Queue()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(jobs, info))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"colocate_grpo.serve: {args.model} ready on http://{args.host}:{args.port}", flush=True)
    while True:
        op, payload, future = jobs.get()
        try:
            if replay is not None:
                dist.broadcast_object_list([(op, payload)], src=0, group=replay)
            future.set_result(host.run(op, payload))
        except Exception as exc:
            future.set_exception(exc)


def spawn_server(model: str, port: int, *flags: str, log=None, ready_timeout: float = 240.0):
    """Start `python -m colocate_grpo.serve` on 127.0.0.1:`port` as a subprocess and wait until it answers.

    For tests, benchmarks and single-machine runs; `flags` are further command-line options (e.g.
    `"--dtype", "float32"`). Output goes to `log` (a file object) or is discarded. Returns the `Popen`; stopping it
    (`terminate()`) stops every server rank. Raises `ServerError` (after killing it) if it is not ready in time.
    """
    import subprocess

    from .client import ServerClient, ServerError

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the server's own --kv-cache-gb applies
    cmd = [sys.executable, "-m", "colocate_grpo.serve", "--model", str(model), "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        ServerClient(f"http://127.0.0.1:{port}").wait_until_ready(ready_timeout)
    except ServerError:
        proc.kill()
        proc.wait()
        raise
    return proc


def parse_args(argv: list[str] | None = None) -> ServeArgs:
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(ServeArgs).parse_args_into_dataclasses(args=argv)
    looks_local = args.model.startswith((".", "/", "~")) or Path(args.model).exists()
    if looks_local and not (Path(args.model).expanduser() / "config.json").exists():
        raise ValueError(
            f"--model {args.model}: no config.json there; pass a model folder (e.g. `make assets`)."
        )
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)  # errors in the arguments surface here, before any model loads
    except ValueError as exc:
        raise SystemExit(f"colocate_grpo.serve: {exc}") from None
    if args.tensor_parallel_size > 1 and "WORLD_SIZE" not in os.environ:
        # Re-launch as K ranks; exec keeps the PID, so stopping this process stops them all.
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        nproc = f"--nproc-per-node={args.tensor_parallel_size}"
        os.execv(sys.executable, [*torchrun, nproc, "-m", "colocate_grpo.serve", *argv])
    serve(args)


if __name__ == "__main__":
    main()
