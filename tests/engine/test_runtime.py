"""Process-level helpers the GPU path depends on, exercised on CPU: local rank, request seeds, sleep level."""

from types import SimpleNamespace

import pytest
import torch

from colocate_grpo.engine.runtime import default_engine_dtype, local_rank
from colocate_grpo.engine.sampling import request_seed
from colocate_grpo.trainer.generation import sleep_level_for


def test_local_rank_never_falls_back_to_the_global_rank(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_rank(0, 1) == 0
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not set for rank 5 of 8"):
        local_rank(5, 8)  # rank 5 of 2 nodes x 4 is local rank 1: the global rank would be wrong
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_rank(5, 8) == 1
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_rank(5, 8) == 3


def test_request_seeds_are_deterministic_and_distinct():
    seeds = {request_seed(42, replica, index) for replica in range(4) for index in range(64)}
    assert len(seeds) == 4 * 64  # replicas and repeated prompts never share a seed
    assert request_seed(42, 1, 3) == request_seed(42, 1, 3)
    assert request_seed(42, 1, 3) != request_seed(43, 1, 3)
    assert all(0 <= s < 2**31 for s in seeds)


def test_sleep_level_two_only_when_every_weight_is_resent_before_the_next_generation(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = SimpleNamespace(steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=4)
    assert sleep_level_for(model, args) == 2
    # Generations more often than optimizer steps: a later generation would run on discarded weights.
    assert sleep_level_for(model, SimpleNamespace(**{**vars(args), "steps_per_generation": 2})) == 1
    model.model.embed_tokens.weight.requires_grad_(False)  # a frozen tensor is sent once only
    assert sleep_level_for(model, args) == 1


def test_default_engine_dtype_on_this_host():
    expected = "auto" if torch.cuda.is_available() else None
    flags = open("/proc/cpuinfo").read()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert default_engine_dtype() == (expected or ("bfloat16" if native else "float32"))
