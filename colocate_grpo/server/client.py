"""HTTP client of `python -m colocate_grpo.serve` (used by the trainer's main process only).

Every request has a timeout and a bounded number of retries (connection refused / reset, timeouts, 502-504), with
1 s, 2 s, 4 s ... back-off; after the last one it raises `ServerError` naming the URL and what to check. Weight
updates go in byte-capped buckets: one HTTP body per bucket, or one NCCL broadcast per bucket announced over HTTP.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from ..engine.runtime import nccl_group
from ..engine.sampling import Rollouts, SamplingConfig
from . import wire

# What a request that never got an HTTP answer raises (refused, reset, timed out, cut off mid-body).
_NETWORK_ERRORS = (urllib.error.URLError, TimeoutError, ConnectionError, http.client.HTTPException, OSError)
_RETRY_STATUS = (502, 503, 504)


class ServerError(RuntimeError):
    """The vLLM server could not be reached, stopped answering, or failed a request."""


class ServerClient:
    """Talks to one `colocate_grpo.serve` server.

    Args:
        base_url (`str`): e.g. `http://127.0.0.1:8000`.
        request_timeout (`float`, *optional*, defaults to `300`): seconds a request may wait on the server.
        retries (`int`, *optional*, defaults to `2`): extra attempts after a connection error or timeout.
        transport (`str`, *optional*, defaults to `"http"`): weight transport, `"http"` or `"nccl"`.
        group_port (`int`, *optional*, defaults to `51216`): NCCL rendezvous port on this host (nccl transport).
        bucket_bytes (`int`, *optional*, defaults to `32 MiB`): largest weight message; bigger buckets are split.
    """

    def __init__(
        self,
        base_url: str,
        request_timeout: float = 300.0,
        retries: int = 2,
        transport: str = "http",
        group_port: int = 51216,
        bucket_bytes: int = 32 << 20,
    ):
        self.base_url = base_url.rstrip("/")
        self.request_timeout = request_timeout
        self.retries = retries
        self.transport = transport
        self.group_port = group_port
        self.bucket_bytes = bucket_bytes
        self._comm = None

    # -- plumbing -----------------------------------------------------------------------------------------------
    def _request(
        self, path: str, body: dict | bytes | tuple | None = None, timeout: float | None = None
    ) -> dict:
        url = f"{self.base_url}{path}"
        if body is None:
            request = urllib.request.Request(url, method="GET")
        elif isinstance(
            body, bytes | tuple
        ):  # raw bytes, or `(length, chunks)` sent chunk by chunk without a join
            length, chunks = (len(body), [body]) if isinstance(body, bytes) else body
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(length)}
            request = urllib.request.Request(url, data=chunks, headers=headers, method="POST")
        else:
            headers = {"Content-Type": "application/json"}
            request = urllib.request.Request(
                url, data=json.dumps(body).encode(), headers=headers, method="POST"
            )
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(2 ** (attempt - 1))
            try:
                with urllib.request.urlopen(request, timeout=timeout or self.request_timeout) as response:
                    return json.loads(response.read() or b"{}")
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode(errors="replace")[:2000]
                if exc.code not in _RETRY_STATUS:
                    raise ServerError(
                        f"vLLM server at {self.base_url} failed {path} (HTTP {exc.code}): {detail}"
                    ) from None
                reason = f"HTTP {exc.code}"
            except _NETWORK_ERRORS as exc:
                reason = str(getattr(exc, "reason", exc)) or type(exc).__name__
        raise ServerError(
            f"vLLM server at {self.base_url} did not answer {path} ({reason}) after {self.retries + 1} attempts with a "
            f"{timeout or self.request_timeout:.0f} s timeout. Check that `python -m colocate_grpo.serve` is still "
            "running there (its log says why it stopped), that this host can reach it, and raise "
            "vllm_server_request_timeout if it is only slow."
        )

    def wait_until_ready(self, timeout: float) -> dict:
        """Poll `/health` until the server answers or `timeout` seconds pass; returns `get_server_info()`."""
        deadline = time.monotonic() + timeout
        reason = "no answer"
        while True:
            try:
                with urllib.request.urlopen(
                    f"{self.base_url}/health", timeout=min(10.0, timeout)
                ) as response:
                    return json.loads(response.read())
            except _NETWORK_ERRORS as exc:
                reason = str(getattr(exc, "reason", exc)) or type(exc).__name__
            if time.monotonic() + 1 > deadline:
                raise ServerError(
                    f"No colocate_grpo vLLM server answered at {self.base_url}/health within {timeout:.0f} s "
                    f"({reason}). Start one on that host with `python -m colocate_grpo.serve --model <model> --port "
                    "<port>` (add `--host 0.0.0.0` to serve other machines), check vllm_server_base_url / "
                    "vllm_server_host / vllm_server_port, or raise vllm_server_timeout if it is still loading."
                )
            time.sleep(1.0)

    def get_server_info(self) -> dict:
        """Model, dtype, TP size, weights version, LoRA support, and `model_config.logprobs_mode` (read by TRL)."""
        return self._request("/info")

    # -- generation ---------------------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingConfig) -> Rollouts:
        """One completion per prompt (shape `[batch, prompt_len_i]`), with the sampled tokens' logprobs."""
        body = {"prompts": prompt_ids, "sampling": wire.sampling_to_json(sampling)}
        out = self._request("/generate", body)
        return Rollouts(out["prompt_ids"], out["completion_ids"], out["logprobs"])

    def prompt_logprobs(self, token_ids: list[int]) -> torch.Tensor:
        """The server's logprobs of `token_ids[1:]`, shape `[len - 1]`, float64 (the sync probe's call)."""
        out = self._request("/prompt_logprobs", {"token_ids": list(token_ids)})
        return torch.tensor(out["logprobs"], dtype=torch.float64)

    def weights_digest(self) -> dict[str, tuple[int, int]]:
        """Per-layer-group digest of the weights the server holds (`ColocatedEngine.weights_digest`)."""
        return {
            group: tuple(value) for group, value in self._request("/weights/digest", {})["groups"].items()
        }

    def reset_prefix_cache(self) -> None:
        self._request("/reset_prefix_cache", {})

    # -- weights ------------------------------------------------------------------------------------------------
    def begin_update(self) -> None:
        if self.transport == "nccl" and self._comm is None:
            self._init_nccl()
        self._request("/weights/begin", {})

    def send_bucket(self, bucket: wire.Bucket) -> int:
        """Send one bucket of full tensors, in messages of at most `bucket_bytes`; returns the bytes sent. Loaded by
        the server before this returns."""
        return sum(self._send_piece(piece) for piece in wire.split_bucket(bucket, self.bucket_bytes))

    def _send_piece(self, bucket: wire.Bucket) -> int:
        if self.transport == "http":
            return self._request("/weights/bucket", wire.encode_bucket(bucket))["bytes"]
        layout = wire.bucket_layout(bucket)
        # The server must accept the bucket before we broadcast: a broadcast it never joins (rejected request,
        # transport not initialised) would block this process on the GPU. A rejection raises ServerError here.
        self._request("/weights/nccl/announce", {"layout": layout})
        device = torch.device("cuda", torch.cuda.current_device())
        buffer = wire.flatten_bucket(bucket, device)
        # The server blocks in the NCCL receive while answering, so the announcement runs beside our broadcast.
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(self._request, "/weights/nccl/bucket", {"layout": layout})
            self._comm.broadcast(buffer, src=0)
            wire.wait_for_stream(self.request_timeout, f"NCCL broadcast to {self.base_url}")
            return answer.result()["bytes"]

    def end_update(self) -> dict:
        """Finish the update: the server repacks what it loaded and drops its prefix cache."""
        return self._request("/weights/end", {})

    def send_adapter(self, tensors: dict[str, torch.Tensor], peft_config: dict) -> int:
        """Replace the served LoRA adapter (server started with `--max-lora-rank`); returns bytes sent."""
        config = {k: sorted(v) if isinstance(v, set) else v for k, v in peft_config.items()}
        metadata = {"peft_config": json.dumps(config, default=str)}
        return self._request("/weights/adapter", wire.pack_bucket(list(tensors.items()), metadata))["bytes"]

    def push(self, buckets: Iterable[wire.Bucket]) -> tuple[int, int]:
        """`begin_update`, every bucket, `end_update`; returns `(tensors, bytes)` (single-process use and benches)."""
        self.begin_update()
        count = nbytes = 0
        for bucket in buckets:
            nbytes += self.send_bucket(bucket)
            count += len(bucket)
        self.end_update()
        return count, nbytes

    def _init_nccl(self) -> None:
        from urllib.parse import urlparse

        url = urlparse(self.base_url)
        host = wire.local_address_towards(url.hostname, url.port or 80)
        world_size = self.get_server_info()["tensor_parallel_size"] + 1
        body = {"host": host, "port": self.group_port, "world_size": world_size}
        with ThreadPoolExecutor(max_workers=1) as pool:  # both sides block in the rendezvous
            answer = pool.submit(self._request, "/weights/nccl/init", body)
            self._comm = nccl_group(host, self.group_port, 0, world_size, torch.cuda.current_device())
            answer.result()
