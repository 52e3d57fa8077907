"""Plot of a training run: every reward series and the seconds per step, from a Trainer's log history."""

from __future__ import annotations

from pathlib import Path


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
