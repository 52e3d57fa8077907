"""GPU-only: server mode with the NCCL weight transport (server on GPU 1, this process the trainer on GPU 0).
Run with `pytest -m gpu tests/gpu` on a machine with 2 CUDA GPUs."""

import socket

import pytest
import torch

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (NCCL cannot pair a GPU with itself)"
)
def test_nccl_bucketed_push_reaches_the_server(tiny_model, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    from colocate_grpo.engine.sampling import SamplingConfig
    from colocate_grpo.server.app import spawn_server
    from colocate_grpo.server.client import ServerClient
    from colocate_grpo.weight_sync.sources import weight_buckets

    port = _free_port()
    monkeypatch.setenv(
        "CUDA_VISIBLE_DEVICES", "1"
    )  # the server's GPU; this process already holds its CUDA context
    torch.cuda.set_device(0)
    with open(tmp_path / "server.log", "w") as log:
        proc = spawn_server(
            tiny_model, port, "--dtype", "float32", "--gpu-memory-utilization", "0.3", log=log
        )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    try:
        client = ServerClient(
            f"http://127.0.0.1:{port}", request_timeout=120, transport="nccl", group_port=_free_port()
        )
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).cuda()
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        ids = list(range(1, 40))
        with torch.no_grad():
            logits = (
                model(input_ids=torch.tensor([ids], device="cuda")).logits[0, :-1].double().log_softmax(-1)
            )
        reference = logits.gather(-1, torch.tensor(ids[1:], device="cuda")[:, None])[:, 0].cpu()
        assert (
            client.prompt_logprobs(ids) - reference
        ).abs().max() > 1e-2  # the server still has the checkpoint
        for _ in range(2):  # the second push reuses the NCCL group
            count, nbytes = client.push(weight_buckets(model, 1 << 20))
        assert count > 0 and nbytes > 0
        assert (client.prompt_logprobs(ids) - reference).abs().max() < 1e-3
        out = client.generate([[1, 2, 3]] * 2, SamplingConfig(max_tokens=4))
        assert [len(c) for c in out.completion_ids] == [4, 4]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
