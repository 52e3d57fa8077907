"""Benchmarks, each printing ratios against a named baseline measured in the same run (medians of repeats with
their spread): steps.py (whole GRPO steps vs TRL's own trainer), sync.py (weight sync per sharding backend vs a
per-parameter sync), server.py (weight updates into a server), verify.py (the cost and the catch rate of the sync
verification). `python -m colocate_grpo.bench` runs them all; `python -m colocate_grpo.bench.<name> --help` one."""
