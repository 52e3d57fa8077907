"""`python -m colocate_grpo.bench [--model DIR] [--recipe YAML]`: every benchmark, one after the other (each starts
its own processes; the machine is shared, so they never run at once). `make bench` runs this."""

from __future__ import annotations

import argparse
import subprocess
import sys


def plan(model: str, recipe: str) -> list[list[str]]:
    """The benchmark commands, in order: `python -m colocate_grpo.bench.<name> ...`."""
    return [
        ["steps", "--recipe", recipe],
        ["sync", "--model", model],
        ["server", "--model", model],
        ["verify", "--model", model, "--correct-steps", "30"],
        ["verify", "--model", model, "--correct-steps", "3", "--configs", "bfloat16:bfloat16"],
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=".cache/models/smollm2-135m")
    parser.add_argument("--recipe", default="recipes/smollm2-135m/colocate_cpu.yaml")
    args = parser.parse_args(argv)
    for name, *flags in plan(args.model, args.recipe):
        cmd = [sys.executable, "-m", f"colocate_grpo.bench.{name}", *flags]
        print(f"[bench] {' '.join(cmd[1:])}", flush=True)
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
