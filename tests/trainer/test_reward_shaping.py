"""Reward robustness (guarded functions), DAPO overlong shaping and dynamic sampling, task rewards and datasets:
built from real parts without a Trainer."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from colocate_grpo.config.rewards import RewardOptions
from colocate_grpo.rewards.robust import RewardError, guard_reward
from colocate_grpo.rewards.shaping import make_overlong_penalty, overlong_penalty_value
from colocate_grpo.trainer.dynamic_sampling import concat_batches, fill_batch, informative_groups


def picky(completions, answer, **_):
    """Raises on the completion 'boom'; returns inf for 'inf'."""
    out = []
    for c, a in zip(completions, answer, strict=True):
        if c == "boom":
            raise ValueError("cannot score this")
        out.append(math.inf if c == "inf" else float(c == a))
    return out


def test_raising_reward_names_the_function_and_the_sample():
    guarded = guard_reward(picky, "raise")
    with pytest.raises(
        RewardError, match=r"Reward function 'picky' raised ValueError: cannot score this on sample 1 "
    ):
        guarded(prompts=["p0", "p1", "p2"], completions=["1", "boom", "2"], answer=["1", "1", "1"])


def test_skip_mode_gives_only_the_failing_and_non_finite_samples_none():
    logged = {}
    guarded = guard_reward(picky, "skip")
    rewards = guarded(
        prompts=["p0", "p1", "p2", "p3"],
        completions=["1", "boom", "inf", "2"],
        answer=["1", "1", "1", "1"],
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert rewards == [1.0, None, None, 0.0]
    assert logged == {"rewards/picky/errors": 1.0, "rewards/picky/non_finite": 1.0}
    assert guarded.__name__ == "picky"  # TRL logs rewards under the function's name


def test_non_finite_rewards_never_pass_even_without_errors():
    guarded = guard_reward(lambda completions, **_: [float("nan"), -math.inf, 0.5], "raise")
    assert guarded(completions=["a", "b", "c"]) == [None, None, 0.5]


def test_overlong_penalty_follows_dapo_eq13():
    # L_max = 20, L_cache = 4: no penalty up to 16 tokens, linear to -1 at 20.
    assert [overlong_penalty_value(n, 20, 4) for n in (10, 16, 17, 18, 20, 25)] == [
        0.0,
        0.0,
        -0.25,
        -0.5,
        -1.0,
        -1.0,
    ]
    reward = make_overlong_penalty(20, 4)
    assert reward(["x", "y"], completion_ids=[[1] * 16, [1] * 19]) == [0.0, -0.75]


def test_overlong_and_dynamic_sampling_options_fail_at_parse_time():
    from colocate_grpo.config import ColocateGRPOConfig

    with pytest.raises(ValueError, match="overlong_buffer_length=64 must be below max_completion_length=64"):
        ColocateGRPOConfig(output_dir="/tmp/x", max_completion_length=64, overlong_buffer_length=64)
    # 2 processes x 2 prompts: TRL accepts the global batch of 4 = one group of 4, but each process would hold
    # half a group; dynamic sampling filters whole groups per process.
    options = RewardOptions(dynamic_sampling=True)
    options.max_completion_length, options.num_generations = 64, 4
    options.per_device_train_batch_size, options.steps_per_generation = 2, 1
    with pytest.raises(ValueError, match="dynamic_sampling needs whole prompt groups"):
        options.check_reward_options()


def _fake_batch(rows: int, completion_len: int, prompt_len: int, tag: int) -> dict:
    return {
        "prompt_ids": torch.full((rows, prompt_len), tag),
        "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
        "completion_ids": torch.full((rows, completion_len), tag),
        "completion_mask": torch.ones(rows, completion_len, dtype=torch.long),
        "advantages": torch.arange(rows, dtype=torch.float32) + 100 * tag,
        "num_items_in_batch": torch.tensor(rows * completion_len),
    }


def test_informative_groups_ignore_unscorable_completions():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.5, float("nan"), 0.5, float("nan"), 0.2, 0.9])
    assert informative_groups(rewards, 3).tolist() == [True, False, False, True]


def test_dynamic_sampling_fills_the_batch_from_new_rounds():
    """2 groups of 2 needed; round 0 has one informative group, round 1 another: the batch is full after 2 rounds
    and holds exactly those groups, padded to the longer round's lengths."""
    rewards = [torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 0.3, 0.7])]
    shapes = [(3, 5), (6, 2)]  # (completion_len, prompt_len) per round

    def generate_round(i):
        return _fake_batch(4, *shapes[i], tag=i + 1), rewards[i]

    batch, stats = fill_batch(
        generate_round, need=2, num_generations=2, max_rounds=3, all_full=lambda full: full
    )
    assert stats == {"rounds": 2.0, "filtered_groups": 2.0, "filled_with_filtered": 0.0}
    assert batch["advantages"].tolist() == [
        100.0,
        101.0,
        202.0,
        203.0,
    ]  # group 0 of round 0, group 1 of round 1
    assert batch["completion_ids"].shape == (4, 6) and batch["prompt_ids"].shape == (4, 5)
    assert batch["completion_ids"][0].tolist() == [1, 1, 1, 0, 0, 0]  # completions right-padded with pad id 0
    assert batch["prompt_ids"][2].tolist() == [0, 0, 0, 2, 2]  # prompts left-padded
    assert batch["completion_mask"][0].tolist() == [1, 1, 1, 0, 0, 0]


def test_dynamic_sampling_stops_at_the_cap_and_fills_with_filtered_groups():
    calls = []

    def generate_round(i):
        calls.append(i)
        return _fake_batch(4, 2, 2, tag=i + 1), torch.ones(4)  # never any variance

    batch, stats = fill_batch(
        generate_round, need=2, num_generations=2, max_rounds=2, all_full=lambda full: full
    )
    assert calls == [0, 1, 2]  # the first round plus 2 extra, then stop
    assert stats == {"rounds": 3.0, "filtered_groups": 6.0, "filled_with_filtered": 2.0}
    assert batch["completion_ids"].shape[0] == 4


def test_dynamic_sampling_keeps_going_while_another_process_is_not_full():
    """all_full is the cross-process agreement: a full process still runs rounds while another one needs them."""
    others_full = iter([False, True])

    def generate_round(i):
        return _fake_batch(2, 2, 2, tag=i + 1), torch.tensor([0.0, 1.0])

    batch, stats = fill_batch(
        generate_round,
        need=1,
        num_generations=2,
        max_rounds=5,
        all_full=lambda full: full and next(others_full),
    )
    assert stats["rounds"] == 2.0 and batch["completion_ids"].shape[0] == 2


def test_concat_batches_keeps_scalars_from_the_first_part():
    merged = concat_batches([_fake_batch(2, 2, 2, 1), _fake_batch(2, 4, 2, 2)], pad_token_id=9)
    assert merged["completion_ids"][0].tolist() == [1, 1, 9, 9]
    assert merged["num_items_in_batch"].item() == 4


def test_reasoning_gym_reward_uses_the_task_scorer():
    from colocate_grpo.data import reasoning_gym_dataset
    from colocate_grpo.rewards.tasks import reasoning_gym_reward

    data = reasoning_gym_dataset("basic_arithmetic", 3, seed=0)
    right = [f"Thinking...\n<answer>{a}</answer>" for a in data["answer"]]
    wrong = ["<answer>definitely not</answer>"] * 3
    boxed = [f"so \\boxed{{{a}}}" for a in data["answer"]]
    scores = reasoning_gym_reward(
        right + wrong + boxed, rg_entry=list(data["rg_entry"]) * 3, task=list(data["task"]) * 3
    )
    assert scores == [1.0] * 3 + [0.0] * 3 + [1.0] * 3


def test_several_reasoning_gym_tasks_and_gsm8k_style_files(tmp_path):
    from colocate_grpo.data import load_prompts
    from colocate_grpo.rewards.math import accuracy_reward

    args = SimpleNamespace(
        dataset_name="reasoning_gym:basic_arithmetic,chain_sum",
        dataset_config=None,
        dataset_train_split="train",
        dataset_size=8,
        prompt_column="prompt",
        answer_column="answer",
        system_prompt=None,
    )
    data = load_prompts(args)
    assert len(data) == 8 and set(data["task"]) == {"basic_arithmetic", "chain_sum"}
    path = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": "2 + 40?", "answer": "2 plus 40 is 42.\n#### 42"},
        {"question": "1,000 + 1?", "answer": "#### 1,001"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    args.dataset_name, args.prompt_column = str(path), "question"
    data = load_prompts(args)
    assert list(data["answer"]) == ["42", "1001"]
    assert accuracy_reward(["The answer is \\boxed{42}", "1001"], answer=list(data["answer"])) == [1.0, 1.0]


def test_humaneval_dataset_has_what_the_code_reward_runs():
    from colocate_grpo.data import humaneval_dataset

    data = humaneval_dataset(3)
    assert len(data) == 3 and {"prompt_code", "test", "entry_point"} <= set(data.column_names)
    assert data[0]["prompt"].endswith(data[0]["prompt_code"])


def test_math_style_worked_solutions_are_parsed_for_their_boxed_answer():
    from colocate_grpo.rewards.math import accuracy_reward

    solution = "We add the two: $3 + 4 = 7$, so the answer is $\\boxed{\\frac{7}{2} \\cdot 2}$."
    assert accuracy_reward(["\\boxed{7}", "\\boxed{8}"], answer=[solution, solution]) == [1.0, 0.0]


def test_reward_missing_its_columns_fails_before_any_model_loads(tiny_model):
    import subprocess
    import sys

    from tests.helpers.launch import ROOT

    cmd = [sys.executable, "-m", "colocate_grpo", "--config", "recipes/tiny/colocate_test.yaml"]
    cmd += ["--model_name_or_path", "/nonexistent/model", "--reward_funcs", "code"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "reward_funcs: 'code' needs dataset columns test+entry_point or tests" in result.stderr
    assert "nonexistent" not in result.stderr  # failed before trying to load the model
