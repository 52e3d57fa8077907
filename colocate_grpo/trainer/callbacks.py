"""End of training: the full log history as `log_history.json` and a plot of reward and step time as `metrics.png`,
both in `output_dir` (the log history survives even when `save_strategy` is "no")."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback

from ..plotting import plot_metrics


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
