"""Rewards and data on real inputs (math-verify, reasoning-gym, local files)."""

import json

import pytest

from colocate_grpo.data import load_prompts, reasoning_gym_dataset, to_chat
from colocate_grpo.rewards import build_reward_funcs, check_reward_names
from colocate_grpo.rewards.format import boxed_answer_reward, think_answer_format_reward
from colocate_grpo.rewards.math import accuracy_reward


def chat(text):
    return [{"role": "assistant", "content": text}]


def test_accuracy_reads_boxed_tag_or_last_number():
    completions = [
        chat("so \\boxed{72}"),
        chat("<answer>72</answer>"),
        chat("it is 70, no, 72"),
        chat("71"),
        chat(""),
    ]
    assert accuracy_reward(completions, answer=["72"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert accuracy_reward([chat("1/2")], answer=["0.5"]) == [1.0]


def test_format_rewards():
    assert think_answer_format_reward([chat("<think>a</think>\n<answer>3</answer>"), chat("3")]) == [1.0, 0.0]
    assert boxed_answer_reward(["\\boxed{3}", "\\boxed{3} \\boxed{4}", "3"]) == [1.0, 0.0, 0.0]


def test_registry_builds_only_listed_and_dotted_paths():
    funcs = build_reward_funcs(["boxed", "tests.helpers.rewards.vowel_fraction"])
    assert [f.__name__ for f in funcs] == ["boxed_answer_reward", "vowel_fraction"]
    with pytest.raises(ValueError, match="unknown reward"):
        check_reward_names(["nonsense"])


@pytest.mark.parametrize("task", ["gsm_symbolic", "basic_arithmetic", "countdown"])
def test_reasoning_gym_tasks_offline(task):
    data = reasoning_gym_dataset(task, size=4, seed=0)
    assert len(data) == 4 and all(data["answer"]) and all(data["prompt"])
    again = reasoning_gym_dataset(task, size=4, seed=0)
    assert data["prompt"] == again["prompt"]  # seeded


def test_local_jsonl_to_chat_with_system_prompt(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"{i}+1?", "solution": i + 1}) for i in range(3)))

    class Args:
        dataset_name, dataset_config, dataset_train_split, dataset_size = str(path), None, "train", 0
        prompt_column, answer_column, system_prompt = "question", "solution", "Be brief."

    data = load_prompts(Args)
    assert data[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "0+1?"},
    ]
    assert data["answer"] == ["1", "2", "3"]
    with pytest.raises(ValueError, match="answer_column"):
        to_chat(data, "prompt", "missing", None)


def test_code_reward_options_come_from_the_run_not_from_module_state():
    """Two code rewards built with different options in one process each keep their own limits (no global)."""
    from types import SimpleNamespace

    slow_adder = "```python\nimport time\ntime.sleep(2)\na, b = map(int, input().split())\nprint(a + b)\n```"
    tests = {"inputs": ["1 2\n"], "outputs": ["3"]}
    strict = SimpleNamespace(code_timeout_s=0.5, code_memory_mb=256, code_max_workers=1)
    lenient = SimpleNamespace(code_timeout_s=20.0, code_memory_mb=256, code_max_workers=1)
    (strict_reward,) = build_reward_funcs(["code"], strict)
    (lenient_reward,) = build_reward_funcs(["code"], lenient)
    assert strict_reward.__name__ == lenient_reward.__name__ == "code_reward"  # TRL logs rewards by name
    assert strict_reward([slow_adder], tests=[tests]) == [0.0]  # killed at 0.5 s
    assert lenient_reward([slow_adder], tests=[tests]) == [1.0]  # the control: the program itself is right
    assert strict_reward([slow_adder], tests=[tests]) == [
        0.0
    ]  # building the second changed nothing in the first
