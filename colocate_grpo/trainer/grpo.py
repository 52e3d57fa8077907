"""`ColocateGRPOTrainer`: TRL's GRPOTrainer with the colocated engine as its generation backend.

Everything else (data loading, reward calculation, advantages, loss, logging, saving) is TRL's. The subclass only
swaps the generation backend for `ColocatedGeneration`, which syncs the policy weights into the in-process engine
once per optimizer step and verifies each sync with a logprob probe.

Use it like `trl.GRPOTrainer`:
    trainer = ColocateGRPOTrainer(model="path/or/id", reward_funcs=[...], args=ColocateGRPOConfig(...),
                                  train_dataset=dataset)
    trainer.train()
Launch multi-process runs with `accelerate launch` (see accelerate_configs/) or torchrun.
"""

from __future__ import annotations

import torch
import trl

from ..config import ColocateGRPOConfig
from ._trl import check_hooks, generation_backend, metrics_store
from .callbacks import MetricsPlotCallback
from .cpu_sharding import cpu_sharding_support, fix_cpu_accelerator
from .generation import ColocatedGeneration, build_generation
from .logprobs import mismatch_sums, plain_token_logps
from .rewards import RewardShapingMixin, prepare_reward_funcs


class ColocateGRPOTrainer(RewardShapingMixin, trl.GRPOTrainer):
    """GRPO trainer whose rollouts come from a vLLM engine inside every training rank.

    Args:
        model (`str` or `PreTrainedModel`):
            The policy. The engine starts from `model.name_or_path` and receives the live weights at the first sync.
        reward_funcs (`list`):
            Reward callables (see `colocate_grpo.rewards`) or reward-model ids, as for `trl.GRPOTrainer`.
        args (`ColocateGRPOConfig`, *optional*):
            Training configuration; defaults to `ColocateGRPOConfig(output_dir="<model>-ColocateGRPO")`.
        **kwargs:
            Passed to `trl.GRPOTrainer` (`train_dataset`, `processing_class`, `peft_config`, `callbacks`, ...).
    """

    _tag_names = ["trl", "grpo", "colocate_grpo"]
    vllm_generation: ColocatedGeneration

    def __init__(self, model, reward_funcs, args: ColocateGRPOConfig | None = None, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = ColocateGRPOConfig(output_dir=f"{name.rstrip('/').split('/')[-1]}-ColocateGRPO")
        if not isinstance(args, ColocateGRPOConfig):
            raise TypeError(
                f"args must be a ColocateGRPOConfig, got {type(args).__name__}; build it with "
                "ColocateGRPOConfig(**your_grpo_config.to_dict())."
            )

        check_hooks()
        unsupported = [name for name in ("tools", "environment_factory") if kwargs.get(name)]
        if unsupported:
            # TRL's tool loop generates again only for the samples that called a tool, so ranks would enter the
            # engine a different number of times: a TP group (and the per-call seeds) would fall out of step.
            raise ValueError(
                f"{' and '.join(unsupported)}: ColocateGRPOTrainer does not run TRL's multi-turn tool loop yet; train "
                "tool use with trl.GRPOTrainer, or pass a rollout_func that calls the tools itself."
            )
        reward_funcs = prepare_reward_funcs(reward_funcs, args)

        def factory(*, model, processing_class, max_num_seqs, **_from_args):
            # The other keywords are `args` fields TRL copied (see `_trl.BACKEND_OPTIONS`); read from `args`.
            return build_generation(model, processing_class, args, max_num_seqs)

        with generation_backend(factory):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, **kwargs)
        if args.dynamic_sampling and not hasattr(self.train_dataset, "__len__"):
            raise ValueError(
                "dynamic_sampling draws fresh prompts by index: pass a map-style train_dataset (not streaming)."
            )
        store = metrics_store(self)
        self._sampling_inputs = None  # (sampling logprobs, mask) of the batch `_compute_loss` is scoring
        engine_dtype = self.vllm_generation.engine.dtype
        if self.vllm_importance_sampling_correction and {engine_dtype, self.model.dtype} == {torch.float32}:
            # float32 on both sides: the probe verifies the engine's logprobs to 1e-3 (measured <= 1e-4) after every
            # sync, so the importance-sampling ratio is 1 within 1e-4 and its extra forward pass buys nothing.
            self.vllm_importance_sampling_correction = False
        self.vllm_generation.bind(
            log_metric=lambda name, value: store["train"][name].append(value),
            step_fn=lambda: self.state.global_step,
            model_fn=lambda: self.model_wrapped,
        )
        self.add_callback(MetricsPlotCallback(plot=args.plot_metrics))

    def _prepare_inputs(self, generation_batch):
        """TRL's input preparation (generation, rewards, advantages); then the engine may free its GPU memory for the
        training step (sleep mode), since this step will not generate again."""
        inputs = super()._prepare_inputs(generation_batch)
        self.vllm_generation.release(training=self.model.training)
        return inputs

    def _compute_loss(self, model, inputs):
        """TRL's loss; the engine's sampling logprobs are kept aside so the trainer's logprobs of the same tokens,
        computed inside, can be compared with them (`sampling/train_inference_*` metrics)."""
        if inputs.get("sampling_per_token_logps") is not None:
            mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
            self._sampling_inputs = (inputs["sampling_per_token_logps"], mask)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._sampling_inputs = None

    def _log_mismatch(self, logps) -> None:
        """Log the train-inference mismatch of the sampled tokens (once per loss forward, averaged over ranks): what
        a reduced-precision engine costs, visible every step."""
        sampling, mask = self._sampling_inputs
        self._sampling_inputs = None  # only the loss forward itself, not nested calls
        sums = mismatch_sums(logps, sampling, mask) if sampling.shape == logps.shape else logps.new_zeros(3)
        # Every rank takes part in the gather (a rank that skipped it would leave the others waiting).
        kl, abs_diff, count = self.accelerator.gather(sums.float()[None]).sum(0).tolist()
        store = metrics_store(self)["train" if self.model.training else "eval"]
        store["sampling/train_inference_kl"].append(kl / max(count, 1.0))
        store["sampling/train_inference_abs_logprob_diff"].append(abs_diff / max(count, 1.0))

    def create_accelerator_and_postprocess(self) -> None:
        """accelerate's Accelerator, with FSDP / DeepSpeed really enabled on CPU (see `colocate_grpo.trainer.cpu_sharding`)."""
        with cpu_sharding_support():
            super().create_accelerator_and_postprocess()
        fix_cpu_accelerator(self.accelerator)

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **multimodal,
    ):
        """Plain completion-only logits where `logprob_impl` resolves to "plain" (CPU by default); TRL's fused LM
        head otherwise, and always for multimodal or MoE-aux-loss batches. Returns `(logps, entropies, aux_loss)`,
        each `[batch, logits_to_keep]` (aux_loss a scalar or None)."""
        use_plain = self.args.resolved_logprob_impl == "plain" and not compute_aux_loss
        if not use_plain or any(v is not None for v in multimodal.values()):
            result = super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size,
                compute_entropy,
                compute_aux_loss,
                **multimodal,
            )
            if self._sampling_inputs is not None:
                self._log_mismatch(result[0])
            return result
        with self.accelerator.autocast():
            logps, entropies = plain_token_logps(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                self.temperature,
                batch_size,
                compute_entropy,
                entropy_requires_grad=self.args.entropy_coef > 0 or self.args.use_adaptive_entropy,
            )
        if self._sampling_inputs is not None:
            self._log_mismatch(logps)
        return logps, entropies, None
