"""Wrap a model the way accelerate's launch configs do (DDP, FSDP1, FSDP2, DeepSpeed ZeRO-3), without a Trainer: the
weight sources read exactly these wrappers, so benchmarks and tests build real sharded policies with it.
Call inside an initialised process group (torchrun, 2 CPU ranks over gloo work)."""

from __future__ import annotations

import torch

BACKENDS = ("ddp", "fsdp1", "fsdp2", "zero3")


def shard_model(model: torch.nn.Module, backend: str) -> torch.nn.Module:
    """Distribute `model` over the process group like accelerate would: DDP replicas, FSDP1 / FSDP2 with one unit
    per decoder layer, or DeepSpeed ZeRO-3 (parameters partitioned, SGD so `initialize` accepts it)."""
    layer_cls = type(model.get_decoder().layers[0]) if hasattr(model, "get_decoder") else None
    if backend == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if backend == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})
        return FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
    if backend == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for module in model.modules():
            if isinstance(module, layer_cls):
                fully_shard(module)
        fully_shard(model)
        return model
    if backend == "zero3":
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "optimizer": {"type": "SGD", "params": {"lr": 0.0}},
            "zero_allow_untested_optimizer": True,
        }
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        return engine
    raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
