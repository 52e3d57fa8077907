"""The one seam to TRL: the generation-backend swap fails loudly when TRL stops calling our factory or passes an
option we would silently ignore; every option TRL 1.16's own backend takes is one we know."""

from __future__ import annotations

import inspect

import pytest
import trl
import trl.trainer.grpo_trainer as grpo_module

from colocate_grpo.trainer._trl import BACKEND_OPTIONS, check_hooks, generation_backend, llm_view


def test_trl_that_never_calls_the_factory_is_a_loud_error():
    built = []
    with pytest.raises(RuntimeError, match=f"trl {trl.__version__}: GRPOTrainer.__init__ no longer builds"):
        with generation_backend(lambda **kw: built.append(kw)):
            pass  # a TRL __init__ that built its backend some other way
    assert built == []
    assert grpo_module.VLLMGeneration.__name__ == "VLLMGeneration"  # restored


def test_factory_called_as_trl_calls_it_passes():
    with generation_backend(lambda **kw: kw):
        out = grpo_module.VLLMGeneration(model=1, processing_class=2, max_num_seqs=3, temperature=1.0)
    assert out["max_num_seqs"] == 3


def test_an_option_trl_adds_later_is_refused_not_dropped():
    with pytest.raises(RuntimeError, match=r"does not know: \['speculative_config'\]"):
        with generation_backend(lambda **kw: kw):
            grpo_module.VLLMGeneration(model=1, speculative_config={"n": 2})


def test_every_option_of_trls_own_backend_is_known():
    from trl.generation.vllm_generation import VLLMGeneration

    params = set(inspect.signature(VLLMGeneration.__init__).parameters) - {"self"}
    assert params <= BACKEND_OPTIONS, sorted(params - BACKEND_OPTIONS)


def test_llm_view_answers_what_trls_tool_loop_reads():
    assert llm_view(512).llm_engine.model_config.max_model_len == 512


def test_hooks_we_override_exist_in_this_trl():
    check_hooks()  # the installed TRL


def test_a_renamed_or_reshaped_hook_is_a_loud_error():
    class Renamed(trl.GRPOTrainer):
        _compute_loss = None  # e.g. TRL renamed it

    class Reshaped(trl.GRPOTrainer):
        def _prepare_inputs(self, batch, extra):  # parameters moved
            pass

    with pytest.raises(RuntimeError, match="GRPOTrainer._compute_loss is missing"):
        check_hooks(Renamed)
    with pytest.raises(RuntimeError, match=r"GRPOTrainer._prepare_inputs is \('batch',\)"):
        check_hooks(Reshaped)


@pytest.mark.parametrize("option", ["tools", "environment_factory"])
def test_tool_loops_are_refused_before_anything_loads(tmp_path, option):
    from colocate_grpo import ColocateGRPOConfig, ColocateGRPOTrainer

    def lookup(city: str) -> str:
        """Weather of a city.

        Args:
            city: the city.
        """
        return "sunny"

    value = [lookup] if option == "tools" else (lambda: None)
    args = ColocateGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4)
    with pytest.raises(
        ValueError, match=f"{option}: ColocateGRPOTrainer does not run TRL's multi-turn tool loop"
    ):
        # "/nonexistent/model": nothing is loaded before the refusal.
        ColocateGRPOTrainer(model="/nonexistent/model", reward_funcs=[lambda completions, **kw: [0.0]], args=args,
                            **{option: value})  # fmt: skip
