"""Weight sources and name normalisation on real small models (no engine needed)."""

import torch
from transformers import AutoModelForCausalLM

from colocate_grpo.weight_sync import weight_source
from colocate_grpo.weight_sync.names import is_adapter_only, to_engine_name


def test_names_strip_every_wrapper():
    assert (
        to_engine_name(
            "module._fsdp_wrapped_module.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight"
        )
        == "model.layers.0.mlp.up_proj.weight"
    )
    assert to_engine_name("base_model.model.model.layers.1.self_attn.q_proj.base_layer.weight") == (
        "model.layers.1.self_attn.q_proj.weight"
    )
    assert to_engine_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert is_adapter_only("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
    assert is_adapter_only("base_model.model.lm_head.original_module.weight")
    assert not is_adapter_only("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight")


def test_plain_source_yields_checkpoint_names_once_for_tied(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    names = [n for n, _ in weight_source(model)]
    assert names == list(dict(model.named_parameters()))  # tied lm_head appears once, under embed_tokens
    assert "lm_head.weight" not in names


def test_peft_source_yields_merged_base_weights_without_touching_the_model(tiny_model):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    reference = {k: v.clone() for k, v in base.state_dict().items()}
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    delta = {}  # the merged weight the engine should receive, computed by hand: W + scale * B @ A
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            delta[to_engine_name(name) + ".weight"] = module.scaling["default"] * (b @ a)
    streamed = dict((n, t.clone()) for n, t in weight_source(model))
    assert set(streamed) == set(reference) - {"lm_head.weight"}  # no LoRA factors, tied head once
    for name, tensor in streamed.items():
        expected = reference[name] + delta.get(name, 0)
        torch.testing.assert_close(tensor, expected, atol=1e-6, rtol=1e-5)
    # Merged out of place: the base layers still hold the original weights, bit for bit.
    q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(q, reference["model.layers.0.self_attn.q_proj.weight"])


def _lora_model(tiny_model):
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"]))


def test_trainable_only_sends_just_the_lora_merged_layers(tiny_model):
    model = _lora_model(tiny_model)
    everything = [n for n, _ in weight_source(model)]
    changing = [n for n, _ in weight_source(model, trainable_only=True)]
    assert sorted(changing) == sorted(n for n in everything if ".q_proj." in n or ".up_proj." in n)
    assert len(changing) == 4  # 2 layers x (q_proj, up_proj)


def test_adapter_source_uses_peft_state_dict_names(tiny_model):
    from peft import get_peft_model_state_dict

    from colocate_grpo.weight_sync.sources import adapter_source

    model = _lora_model(tiny_model)
    streamed = dict(adapter_source(model))
    expected = get_peft_model_state_dict(model)
    assert streamed.keys() == expected.keys()
    assert all(torch.equal(streamed[k], expected[k]) for k in expected)


def test_weight_buckets_cover_every_tensor_in_order(tiny_model):
    from colocate_grpo.weight_sync.sources import weight_buckets

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    buckets = list(weight_buckets(model, bucket_bytes=1 << 20))
    assert [n for b in buckets for n, _ in b] == [n for n, _ in weight_source(model)]


def test_merged_lora_on_a_plain_model_respects_the_bucket_cap(tiny_model):
    """Merged tensors are new copies: a plain (DDP) model's LoRA-merged layers are bucketed under the byte cap,
    while a model without LoRA (views only) stays one bucket."""
    from peft import LoraConfig, get_peft_model

    from colocate_grpo.weight_sync import weight_buckets

    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert len(list(weight_buckets(base, bucket_bytes=1 << 16))) == 1
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj", "down_proj"])
    )
    cap = 200_000  # bytes; one merged up_proj/down_proj is 128 x 256 x 4 = 131 kB
    buckets = [[(n, t) for n, t in bucket] for bucket in weight_buckets(model, bucket_bytes=cap)]
    assert len(buckets) > 2
    merged = ("q_proj", "up_proj", "down_proj")
    for bucket in buckets:
        assert (
            sum(
                t.numel() * t.element_size()
                for n, t in bucket
                if n.endswith(tuple(f"{m}.weight" for m in merged))
            )
            <= cap
        )
