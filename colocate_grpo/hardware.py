"""How many cores a process of this launch may use: the one rule the engine threads, the server ranks' threads, the
trainer's threads in server mode and the code-reward sandboxes all follow, so they never oversubscribe the cores."""

from __future__ import annotations

import os


def cores_per_process(local_world_size: int | None = None) -> int:
    """The machine's cores divided evenly among the processes launched on it (at least 1).

    Args:
        local_world_size (`int`, *optional*):
            Processes sharing this machine; defaults to `LOCAL_WORLD_SIZE` (set by torchrun / accelerate), else 1.
    """
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, (os.cpu_count() or 1) // max(1, local_world_size))
