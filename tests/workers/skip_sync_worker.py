"""Train the tiny model in-process with a sabotaged sync: from the second sync on, the engine silently drops the
weights it is given (as a buggy source or sink would). The probe must stop training with StaleWeightsError."""

import sys

from colocate_grpo import ColocateGRPOConfig, ColocateGRPOTrainer
from colocate_grpo.data import reasoning_gym_dataset, to_chat
from tests.helpers.rewards import vowel_fraction


def main(model_dir: str, out_dir: str) -> None:
    args = ColocateGRPOConfig(
        output_dir=out_dir,
        max_steps=4,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        gradient_checkpointing=False,
        vllm_max_model_length=512,
        vllm_cpu_kvcache_space_gb=1,
    )
    data = to_chat(reasoning_gym_dataset("basic_arithmetic", 32, 0), "prompt", "answer", None)
    trainer = ColocateGRPOTrainer(
        model=model_dir, reward_funcs=[vowel_fraction], args=args, train_dataset=data
    )
    engine = trainer.vllm_generation.engine
    real_load = engine.load_buckets

    def dropping_load(buckets):
        if trainer.vllm_generation.sync_count == 0:
            return real_load(buckets)
        return real_load(iter(()))  # consumes nothing: the engine keeps its old weights

    engine.load_buckets = dropping_load
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
