"""colocate_grpo: GRPO with vLLM inside every training rank and verified in-process weight sync.

`import colocate_grpo` works without vllm, deepspeed or peft installed; they are imported where used.
"""

__version__ = "0.1.0"

__all__ = ["ColocateGRPOConfig", "ColocateGRPOTrainer"]


def __getattr__(name: str):
    # Lazy so that `python -m colocate_grpo.assets` and config parsing don't pay for importing TRL's trainer.
    if name == "ColocateGRPOConfig":
        from .config import ColocateGRPOConfig

        return ColocateGRPOConfig
    if name == "ColocateGRPOTrainer":
        from .trainer import ColocateGRPOTrainer

        return ColocateGRPOTrainer
    raise AttributeError(name)
