"""Typed options, checked at parse time: the trainer's (`ColocateGRPOConfig`, with the reward options mixed in), the
command line's data and model (`ScriptArguments`, `ModelArguments`) and the server's (`ServeArgs`).

Precedence is dataclass defaults < YAML recipe (`--config`) < command-line flags (`trl.TrlParser`, which also
rejects unknown YAML keys). `__post_init__` only validates and resolves: anything that touches the environment, the
filesystem or threads happens in the CLI or the trainer.
"""

from .engine import check_engine_dtype
from .rewards import RewardOptions
from .script import ModelArguments, ScriptArguments, check_eval, check_lora_mode
from .server import ServeArgs
from .trainer import ColocateGRPOConfig

__all__ = [
    "ColocateGRPOConfig",
    "ModelArguments",
    "RewardOptions",
    "ScriptArguments",
    "ServeArgs",
    "check_engine_dtype",
    "check_eval",
    "check_lora_mode",
]
