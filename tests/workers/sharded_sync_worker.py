"""Run under torchrun (2 CPU ranks): shard a real model with FSDP1 / FSDP2 / ZeRO-3 (optionally with LoRA), sync it
into the colocated engine bucket by bucket, and report what the pytest side asserts:

- the parameters are really sharded (local fraction of the bytes),
- every streamed tensor equals the full weight computed from an unsharded copy (merged, for LoRA),
- the engine's own tensors equal those full weights after the sync, and the probe matches,
- the bucketed FSDP2 all-gather equals `full_tensor()`,
- peak extra RSS while draining the source on a wider model, for a small bucket and for one all-in bucket.

Usage: torchrun --nproc_per_node 2 tests/workers/sharded_sync_worker.py MODEL_DIR BACKEND LORA(0|1) REPORT_DIR
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("DS_SKIP_SHM_OP", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from colocate_grpo.weight_sync import SyncProbe, weight_source  # noqa: E402
from colocate_grpo.weight_sync.sharding import shard_model  # noqa: E402
from colocate_grpo.weight_sync.sources import detect_backend, local_fraction  # noqa: E402

LORA_TARGETS = ["q_proj", "v_proj", "up_proj", "down_proj"]


def add_lora(model):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS))
    torch.manual_seed(7)  # same adapter on every rank, non-zero B so the merge matters
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def expected_weights(model) -> dict[str, torch.Tensor]:
    """What the engine must hold, from an unsharded copy: base weights with LoRA merged by PEFT itself."""
    import copy

    ref = copy.deepcopy(model)
    if hasattr(ref, "merge_and_unload"):
        ref = ref.merge_and_unload()
    return {k: v.detach().clone() for k, v in ref.named_parameters()}


def engine_matches(engine, expected: dict[str, torch.Tensor]) -> list[str]:
    """Names of engine tensors that differ from the expected full weights (vLLM stacks q/k/v and gate/up)."""
    stacked = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    bad, checked = [], 0
    for name, param in engine.model.named_parameters():
        for fused, parts in stacked.items():
            if f".{fused}." in name:
                want = torch.cat([expected[name.replace(fused, part)] for part in parts])
                break
        else:
            if name not in expected:
                continue
            want = expected[name]
        checked += 1
        if param.shape != want.shape or not torch.allclose(param.float(), want.float(), atol=1e-6, rtol=0):
            bad.append(name)
    return bad if checked else ["<nothing compared>"]


def rss_peak_mb_during(fn) -> tuple[float, float]:
    """(peak RSS above the starting RSS while `fn` runs, starting RSS), in MiB; Linux only (clear_refs resets the
    high-water mark of this process)."""

    def status(key: str) -> float:
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) / 1024
        raise RuntimeError(key)

    from colocate_grpo.weight_sync.shm import release_host_buffers

    release_host_buffers()  # measure a sync that must build its shared buffer (as the first one does)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = status("VmRSS:")
    fn()
    return status("VmHWM:") - start, start


def drain_copying(model, bucket_bytes) -> None:
    """A sink like the engine's: copy every streamed tensor into memory that already exists."""
    sink = getattr(drain_copying, "sink", None)
    for name, tensor in weight_source(model, bucket_bytes):
        sink[name].copy_(tensor)


def memory_phase(backend: str, lora: bool, report: dict) -> None:
    config = LlamaConfig(
        vocab_size=1024, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    if lora:
        model = add_lora(model)
    drain_copying.sink = {k: v.clone() for k, v in expected_weights(model).items()}
    full_mb = sum(v.numel() * v.element_size() for v in drain_copying.sink.values()) / 2**20
    model = shard_model(model, backend)
    drain_copying(model, 1 << 20)  # warm-up: first-use allocations of the collectives
    small = 20 << 20
    report["mem_full_mb"] = full_mb
    report["mem_bucket_mb"] = small / 2**20
    report["mem_largest_item_mb"] = (
        max(v.numel() * v.element_size() for v in drain_copying.sink.values()) / 2**20
    )
    report["mem_peak_small_mb"], _ = rss_peak_mb_during(lambda: drain_copying(model, small))
    report["mem_peak_all_mb"], _ = rss_peak_mb_during(lambda: drain_copying(model, 1 << 40))


def main(model_dir: str, backend: str, lora: bool, report_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from colocate_grpo.engine.colocated import ColocatedEngine, configure_cpu_runtime

    configure_cpu_runtime(int(os.environ.get("LOCAL_WORLD_SIZE", 2)), kv_cache_gb=1)
    engine = ColocatedEngine(
        model_dir, dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=8
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():  # move away from the checkpoint the engine started from, identically on all ranks
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    if lora:
        model = add_lora(model)
    expected = expected_weights(model)
    model = shard_model(model, backend)
    report = {"rank": rank, "backend": detect_backend(model), "local_fraction": local_fraction(model)}

    streamed = {name: t.clone() for name, t in weight_source(model, 64 << 10)}  # small buckets: many gathers
    report["streamed_names_match"] = sorted(streamed) == sorted(k for k in expected if k != "lm_head.weight")
    report["streamed_mismatch"] = [
        k for k, v in streamed.items() if not torch.allclose(v, expected[k], atol=1e-6, rtol=0)
    ]
    probe = SyncProbe(list(range(100, 140)), tolerance=1e-3)
    report["probe_before"] = probe.measure(model, engine)
    count, nbytes = engine.load_weights(weight_source(model, 8 << 20))
    report["loaded"] = [count, nbytes]
    report["engine_mismatch"] = engine_matches(engine, expected)
    report["probe_after"] = probe.measure(model, engine)
    if backend == "fsdp2":
        from torch.distributed.tensor import DTensor

        from colocate_grpo.weight_sync.gather import gather_fsdp2

        params = [p for p in model.parameters() if isinstance(p, DTensor)]
        with gather_fsdp2(params) as full:
            same = [torch.equal(full(p), p.full_tensor()) for p in params]
        report["fsdp2_bucket_equals_full_tensor"] = bool(params) and all(same)
    del engine
    memory_phase(backend, lora, report)
    os.makedirs(report_dir, exist_ok=True)
    with open(os.path.join(report_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4])
