"""The plain logprob path agrees with TRL's fused LM head (values and gradients) on the tiny model."""

import torch
from transformers import AutoModelForCausalLM
from trl.trainer.utils import add_fused_lm_head

from colocate_grpo.trainer.logprobs import plain_token_logps


def test_plain_matches_trl_fused_head(tiny_model):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    ids = torch.randint(10, 1000, (3, 20))
    mask = torch.ones_like(ids)
    keep, temperature = 8, 0.7

    logps, ent = plain_token_logps(model, ids, mask, keep, temperature, batch_size=2, compute_entropy=True)
    logps.sum().backward()
    grad_plain = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()

    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    labels = ids.clone()
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    out.log_probs[:, -keep:].sum().backward()

    assert logps.shape == (3, keep) and ent.shape == (3, keep)
    torch.testing.assert_close(logps, out.log_probs[:, -keep:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, out.entropy[:, -keep:].detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(grad_plain, model.model.embed_tokens.weight.grad, atol=1e-5, rtol=1e-4)
