"""Server mode: `python -m colocate_grpo.serve` as a real subprocess on 127.0.0.1 with the tiny model, driven by the
client directly and by real 1- and 2-process training runs; failures (no server, server killed, slow server) must
stop every trainer rank with a clear error within the timeouts."""

from __future__ import annotations

import glob
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import safetensors.torch
import torch

from colocate_grpo.engine.sampling import SamplingConfig
from colocate_grpo.server.client import ServerClient, ServerError
from colocate_grpo.server.wire import (
    bucket_layout,
    flatten_bucket,
    layout_bytes,
    pack_bucket,
    split_bucket,
    unflatten_bucket,
    unpack_bucket,
)
from tests.helpers.launch import run_cmd
from tests.helpers.server import free_port, start_server, stop, train_cmd


def test_wire_round_trips_tied_and_half_precision_tensors():
    embed = torch.randn(6, 4)
    bucket = [
        ("embed", embed),
        ("lm_head", embed),
        ("w", torch.randn(3, 2).to(torch.bfloat16)),
        ("b", torch.ones(2)),
    ]
    bucket.append(("scalar", torch.tensor(7, dtype=torch.int64)))
    data = pack_bucket(bucket, {"k": "v"})
    for back, meta in (unpack_bucket(data), unpack_bucket(bytearray(data))):
        assert meta == {"k": "v"}
        back = dict(back)
        assert all(torch.equal(back[name], t) and back[name].dtype == t.dtype for name, t in bucket)
    reference = safetensors.torch.load(data)  # the stream is plain safetensors
    assert all(torch.equal(reference[name], t) for name, t in bucket)
    pieces = list(
        split_bucket(bucket, 40)
    )  # 96-byte embed and lm_head alone, then w + b + scalar (12 + 8 + 8 bytes)
    assert [[name for name, _ in piece] for piece in pieces] == [["embed"], ["lm_head"], ["w", "b", "scalar"]]
    flat = flatten_bucket(bucket, torch.device("cpu"))  # mixed dtypes: each tensor starts 8-byte aligned
    assert flat.numel() == layout_bytes(bucket_layout(bucket))
    views = dict(unflatten_bucket(flat, bucket_layout(bucket)))
    assert all(torch.equal(views[name], t) for name, t in bucket)


def test_no_server_gives_clear_error_quickly():
    url = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(ServerError, match=f"{url}/health within 2 s.*colocate_grpo.serve"):
        ServerClient(url).wait_until_ready(2)
    assert time.monotonic() - start < 10
    start = time.monotonic()
    with pytest.raises(ServerError, match=f"{url} did not answer /generate .* 2 attempts"):
        ServerClient(url, request_timeout=5, retries=1).generate([[1, 2]], SamplingConfig(max_tokens=2))
    assert time.monotonic() - start < 10


def test_slow_server_times_out_with_bounded_retries():
    """A server that accepts the request but never answers within the timeout: retried once, then a clear error."""
    calls = []

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self):
            calls.append(time.monotonic())
            time.sleep(3)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    start = time.monotonic()
    with pytest.raises(
        ServerError, match="did not answer /prompt_logprobs .*timed out.* 2 attempts.*request_timeout"
    ):
        ServerClient(url, request_timeout=0.5, retries=1).prompt_logprobs([1, 2, 3])
    assert time.monotonic() - start < 5 and len(calls) == 2
    httpd.shutdown()


def test_server_generates_and_takes_bucketed_weights(server, tiny_model):
    from transformers import AutoModelForCausalLM

    from colocate_grpo.weight_sync.sources import weight_buckets

    client = ServerClient(server, request_timeout=60, bucket_bytes=1 << 20)
    out = client.generate([[1, 2, 3], [4, 5]], SamplingConfig(max_tokens=5))
    assert out.prompt_ids == [[1, 2, 3], [4, 5]]
    assert [len(c) for c in out.completion_ids] == [5, 5] and [len(lp) for lp in out.logprobs] == [5, 5]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    ids = list(range(1, 40))
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)
    reference = logits.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].detach()
    assert (
        client.prompt_logprobs(ids) - reference
    ).abs().max() > 0.01  # the server still has the old weights
    version = client.get_server_info()["weights_version"]
    client.begin_update()
    count = nbytes = 0
    for bucket in weight_buckets(
        model, None
    ):  # one bucket of every tensor; the client caps messages at 1 MiB
        nbytes += client.send_bucket(bucket)
        count += len(bucket)
    pieces = sum(len(list(split_bucket(b, 1 << 20))) for b in weight_buckets(model, None))
    assert client.end_update()["messages"] == pieces > 1
    assert count == len(model.state_dict()) - 1  # the tied lm_head is not sent separately
    assert nbytes == sum(p.numel() * 4 for p in model.parameters())
    assert (client.prompt_logprobs(ids) - reference).abs().max() < 1e-4
    assert client.get_server_info()["weights_version"] == version + 1


def test_server_digest_matches_what_was_pushed_and_nccl_is_refused_before_any_broadcast(server, tiny_model):
    from transformers import AutoModelForCausalLM

    from colocate_grpo.weight_sync.digest import DigestCheck, mismatched_groups
    from colocate_grpo.weight_sync.sources import weight_buckets

    client = ServerClient(server, request_timeout=60, bucket_bytes=1 << 20)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    digest = DigestCheck(torch.float32)
    client.push(digest.track(weight_buckets(model, 1 << 20)))
    assert mismatched_groups(digest.expected(), client.weights_digest()) == []
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    list(digest.track(weight_buckets(model, 1 << 20)))  # hashed, never sent: the server is now stale
    assert mismatched_groups(digest.expected(), client.weights_digest()) == ["model"]
    # The NCCL transport against a server whose NCCL group was never set up: the announcement is refused, so the
    # client raises before broadcasting (a broadcast the server never joins would block the trainer's GPU).
    nccl = ServerClient(server, request_timeout=30, retries=0, transport="nccl")
    nccl._comm = object()  # any use of it (a broadcast) would raise AttributeError, not ServerError
    with pytest.raises(ServerError, match="before /weights/nccl/init"):
        nccl.send_bucket([("model.norm.weight", torch.ones(128))])


def test_tensor_parallel_server_replays_every_call_on_both_ranks(tiny_model, tmp_path):
    """--tensor-parallel-size 2: the command re-launches itself as 2 ranks; weights loaded through rank 0's HTTP
    endpoint reach both shards (the probe would see a half-updated model otherwise)."""
    from transformers import AutoModelForCausalLM

    from colocate_grpo.weight_sync.sources import weight_buckets

    port = free_port()
    segments_before = set(glob.glob("/dev/shm/cgrpo*"))
    with open(tmp_path / "server.log", "w") as log:
        proc = start_server(tiny_model, port, "--tensor-parallel-size", "2", log=log)
    try:
        client = ServerClient(f"http://127.0.0.1:{port}", request_timeout=60)
        assert client.get_server_info()["tensor_parallel_size"] == 2
        out = client.generate([[1, 2, 3]] * 3, SamplingConfig(max_tokens=4))
        assert [len(c) for c in out.completion_ids] == [4, 4, 4]
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        client.push(weight_buckets(model, 4 << 20))
        ids = list(range(1, 40))
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)
        reference = logits.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].detach()
        assert (client.prompt_logprobs(ids) - reference).abs().max() < 1e-4
    finally:
        proc.terminate()  # torchrun stops both ranks
        proc.wait(timeout=60)
    time.sleep(1)
    ranks = subprocess.run(
        ["pgrep", "-f", f"colocate_grpo.serve.*--port {port}"], capture_output=True, text=True
    )
    assert ranks.stdout.strip() == "", "a server rank outlived its launcher"
    assert set(glob.glob("/dev/shm/cgrpo*")) <= segments_before, (
        "the TP group's shared memory was left behind"
    )


def test_lora_adapter_sync_through_server(tiny_model, tmp_path):
    """weight_sync_lora_mode=adapter in server mode: the base goes once, then only the LoRA factors; the probe (run
    against the server with its adapter) matches every step."""
    port = free_port()
    lora_flags = ["--max-lora-rank", "8", "--lora-target-modules", "q_proj", "v_proj"]
    with open(tmp_path / "server.log", "w") as log:
        proc = start_server(tiny_model, port, *lora_flags, log=log)
    try:
        flags = ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--learning_rate", "5e-2"]
        flags += ["--lora_target_modules", "q_proj", "v_proj", "--weight_sync_lora_mode", "adapter"]
        out = tmp_path / "run"
        result = run_cmd(train_cmd(tiny_model, out, f"http://127.0.0.1:{port}", *flags))
    finally:
        stop(proc)
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [
        r for r in json.loads((out / "log_history.json").read_text()) if "sync/probe_max_logprob_diff" in r
    ]
    assert len(steps) == 3 and all(r["sync/probe_max_logprob_diff"] < 1e-4 for r in steps)
    assert steps[1]["sync/bytes"] < 0.05 * steps[0]["sync/bytes"]  # adapter only after the first sync


def test_adapter_mode_needs_a_lora_server(server, tiny_model, tmp_path):
    flags = [
        "--use_peft",
        "true",
        "--lora_r",
        "8",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--weight_sync_lora_mode",
        "adapter",
    ]
    result = run_cmd(train_cmd(tiny_model, tmp_path / "run", server, *flags, processes=1), timeout=300)
    assert result.returncode != 0
    assert (
        "was started without LoRA; restart it with `--max-lora-rank 8 --lora-target-modules q_proj v_proj`"
        in (result.stdout + result.stderr)
    )
