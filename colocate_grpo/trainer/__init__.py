"""The trainer side: `ColocateGRPOTrainer` (grpo.py, TRL hooks only) and what it composes — the generation backend
TRL calls (generation.py: engine + weight source + verification), reward handling (rewards.py,
dynamic_sampling.py), loss logprobs (logprobs.py), accelerate on CPU (cpu_sharding.py), callbacks, and every TRL
private we touch (_trl.py)."""

__all__ = ["ColocateGRPOTrainer"]


def __getattr__(name: str):
    # Lazy: `colocate_grpo.trainer.logprobs` & co. must not pay for importing TRL's trainer.
    if name == "ColocateGRPOTrainer":
        from .grpo import ColocateGRPOTrainer

        return ColocateGRPOTrainer
    raise AttributeError(name)
