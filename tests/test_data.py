"""Datasets as users have them: folders with train and test files (only the requested split is used, and the log
says which files went where), reference answers under common names, and no reference at all when no reward needs
one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from colocate_grpo.data import load_eval_prompts, load_prompts, split_files
from colocate_grpo.rewards import check_reward_inputs


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))


def args_for(name, **overrides):
    base = dict(dataset_name=str(name), dataset_config=None, dataset_train_split="train", dataset_size=0)
    base.update(prompt_column="question", answer_column="answer", system_prompt=None)
    return SimpleNamespace(**{**base, **overrides})


def test_a_folder_with_train_and_test_files_trains_on_train_only(tmp_path, capsys):
    write_jsonl(tmp_path / "train.jsonl", [{"question": f"train {i}", "answer": i} for i in range(6)])
    write_jsonl(tmp_path / "test.jsonl", [{"question": f"test {i}", "answer": i} for i in range(2)])
    train = load_prompts(args_for(tmp_path))
    assert len(train) == 6 and all("train" in p[0]["content"] for p in train["prompt"])
    assert "using the 'train' split (train: train.jsonl; test: test.jsonl)" in capsys.readouterr().out
    test = load_prompts(args_for(tmp_path, dataset_train_split="test"))
    assert len(test) == 2 and all("test" in p[0]["content"] for p in test["prompt"])
    with pytest.raises(ValueError, match="no 'validation' split there"):
        load_prompts(args_for(tmp_path, dataset_train_split="validation"))


def test_split_names_follow_datasets_conventions(tmp_path):
    names = [
        "data-train-00.parquet",
        "data-train-01.parquet",
        "valid.csv",
        "dev_set.json",
        "eval.jsonl",
        "notes.jsonl",
    ]
    splits = split_files([tmp_path / n for n in names])
    assert {k: [p.name for p in v] for k, v in splits.items()} == {
        "train": ["data-train-00.parquet", "data-train-01.parquet"],
        "validation": ["valid.csv", "dev_set.json"],
        "test": ["eval.jsonl"],
        "unused": ["notes.jsonl"],
    }
    # Control: shards with no split word are all training data (as before).
    assert list(split_files([tmp_path / "part-0.jsonl", tmp_path / "part-1.jsonl"])) == ["train"]


def test_reference_under_a_common_name_and_none_when_no_reward_needs_it(tmp_path):
    write_jsonl(tmp_path / "r1.jsonl", [{"problem": "1+1?", "solution": "\\boxed{2}"}])
    data = load_prompts(args_for(tmp_path / "r1.jsonl", prompt_column="problem"))
    assert data["answer"] == ["\\boxed{2}"]  # open-r1 style `solution`
    write_jsonl(tmp_path / "bare.jsonl", [{"question": "Write a haiku."}])
    bare = load_prompts(args_for(tmp_path / "bare.jsonl"))
    assert "answer" not in bare.column_names
    check_reward_inputs(
        ["format", "tests.helpers.rewards.vowel_fraction"], bare.column_names
    )  # nothing needed
    with pytest.raises(ValueError, match="'accuracy' needs dataset columns answer"):
        check_reward_inputs(["accuracy"], bare.column_names)  # control: a reward that reads a reference
    with pytest.raises(ValueError, match="answer_column='label' is not a column"):
        load_prompts(args_for(tmp_path / "bare.jsonl", answer_column="label"))  # an explicit name must exist


def test_plain_text_prompts_for_models_without_a_chat_template(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"question": "2+2?", "answer": "4"}])
    text = load_prompts(args_for(tmp_path / "d.jsonl", system_prompt="Be brief."), chat=False)
    assert text["prompt"] == ["Be brief.\n\n2+2?"]
    chat = load_prompts(args_for(tmp_path / "d.jsonl"), chat=True)  # control: the chat form
    assert chat["prompt"] == [[{"role": "user", "content": "2+2?"}]]
    write_jsonl(tmp_path / "m.jsonl", [{"question": [{"role": "user", "content": "hi"}], "answer": "x"}])
    with pytest.raises(ValueError, match="holds chat messages but prompt_format is text"):
        load_prompts(args_for(tmp_path / "m.jsonl"), chat=False)


def test_evaluation_prompts_come_from_the_test_split_or_the_eval_dataset(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"question": f"train {i}", "answer": i} for i in range(6)])
    write_jsonl(tmp_path / "test.jsonl", [{"question": f"test {i}", "answer": i} for i in range(2)])
    evaluation = load_eval_prompts(args_for(tmp_path, dataset_test_split="test", eval_dataset_name=None))
    assert [p[0]["content"] for p in evaluation["prompt"]] == ["test 0", "test 1"]
    held_out = tmp_path / "held_out.jsonl"
    write_jsonl(held_out, [{"question": "held out", "answer": 1}])
    evaluation = load_eval_prompts(
        args_for(tmp_path, dataset_test_split="test", eval_dataset_name=str(held_out))
    )
    assert [p[0]["content"] for p in evaluation["prompt"]] == [
        "held out"
    ]  # a single file is the whole eval set
