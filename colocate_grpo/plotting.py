"""End of training: the full log history as `log_history.json` and a plot of reward and step time as `metrics.png`,
both in `output_dir` (the log history survives even when `save_strategy` is "no")."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback


class MetricsPlotCallback(TrainerCallback):
    """Record wall time per optimizer step; at the end, plot rewards (from the log history) and step seconds."""

    def __init__(self, plot: bool = True):
        self.plot = plot
        self._last = None
        self.step_seconds: list[tuple[int, float]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if self._last is None:
            self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_seconds.append((state.global_step, now - self._last))
        self._last = now

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            out = Path(args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "log_history.json").write_text(json.dumps(state.log_history, indent=1))
            if self.plot:
                plot_metrics(state.log_history, self.step_seconds, out / "metrics.png")


def plot_metrics(log_history: list[dict], step_seconds: list[tuple[int, float]], path: Path) -> Path:
    """Write a two-panel PNG: every `reward*` series vs step, and seconds per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_t) = plt.subplots(1, 2, figsize=(11, 4))
    keys = sorted(
        {
            k
            for row in log_history
            for k in row
            if k == "reward" or (k.startswith("rewards/") and k.endswith("/mean"))
        }
    )
    for key in keys:
        points = [(row["step"], row[key]) for row in log_history if key in row]
        ax_r.plot(*zip(*points), marker="o", label=key)
    ax_r.set(xlabel="step", ylabel="reward", title="Reward")
    if keys:
        ax_r.legend(fontsize=8)
    if step_seconds:
        ax_t.plot(*zip(*step_seconds), marker="o")
    ax_t.set(xlabel="step", ylabel="seconds", title="Step time")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
