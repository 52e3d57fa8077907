"""Options of `python -m colocate_grpo.serve` (`ServeArgs`), checked at parse time."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ServeArgs:
    """Arguments of `python -m colocate_grpo.serve`.

    Args:
        model (`str`): local model folder (or hub id when online) the server starts from.
        host (`str`, *optional*, defaults to `"127.0.0.1"`): interface to bind; loopback unless set explicitly.
        port (`int`, *optional*, defaults to `8000`): HTTP port.
        tensor_parallel_size (`int`, *optional*, defaults to `1`): processes (GPUs) holding one model replica.
        dtype (`str`, *optional*): engine dtype; `auto` is vLLM's rule; unset, the trainer's default
            (`colocate_grpo.engine.runtime.default_engine_dtype`: auto on GPU, per-CPU choice on CPU).
        max_model_len (`int`, *optional*): prompt + completion tokens per sequence.
        max_num_seqs (`int`, *optional*, defaults to `256`): largest batch vLLM schedules at once.
        gpu_memory_utilization (`float`, *optional*, defaults to `0.9`): GPU memory fraction for vLLM.
        enforce_eager (`bool`, *optional*, defaults to `False`): skip CUDA graphs / torch.compile.
        seed (`int`, *optional*, defaults to `0`): sampling seed.
        kv_cache_gb (`int`, *optional*, defaults to `2`): KV-cache GiB on CPU.
        cpu_threads (`int`, *optional*): threads per server process on CPU (default: cores / TP size).
        max_lora_rank (`int`, *optional*): serve in-memory LoRA adapters up to this rank (adapter-only sync).
        lora_target_modules (`list[str]`, *optional*): module names the adapters target (with `max_lora_rank`).
        trust_remote_code (`bool`, *optional*, defaults to `False`): let vLLM run the checkpoint's modelling code.
        model_impl (`str`, *optional*, defaults to `"auto"`): vLLM's model implementation (auto, vllm, transformers).
    """

    model: str = field(metadata={"help": "Local model folder (or hub id when online)."})
    host: str = field(
        default="127.0.0.1", metadata={"help": "Interface to bind (0.0.0.0 = every interface)."}
    )
    port: int = field(default=8000, metadata={"help": "HTTP port."})
    tensor_parallel_size: int = field(default=1, metadata={"help": "Processes per model replica."})
    dtype: str | None = field(
        default=None,
        metadata={"help": "Engine dtype (auto = vLLM's rule; unset: auto on GPU, fastest on CPU)."},
    )
    max_model_len: int | None = field(default=None, metadata={"help": "Prompt + completion tokens."})
    max_num_seqs: int = field(default=256, metadata={"help": "Largest batch vLLM schedules at once."})
    gpu_memory_utilization: float = field(default=0.9, metadata={"help": "GPU memory fraction for vLLM."})
    enforce_eager: bool = field(default=False, metadata={"help": "Skip CUDA graphs / torch.compile."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    kv_cache_gb: int = field(default=2, metadata={"help": "KV-cache GiB on CPU."})
    cpu_threads: int | None = field(default=None, metadata={"help": "Threads per process on CPU."})
    max_lora_rank: int | None = field(
        default=None, metadata={"help": "Enable in-memory LoRA up to this rank."}
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Let vLLM run the checkpoint's own modelling code."}
    )
    model_impl: str = field(
        default="auto", metadata={"help": "vLLM model implementation: auto, vllm or transformers."}
    )
    lora_target_modules: list[str] | None = field(
        default=None, metadata={"help": "LoRA target module names."}
    )

    def __post_init__(self):
        if not 0 < self.port < 65536:
            raise ValueError(f"--port must be in 1..65535, got {self.port}.")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size must be >= 1, got {self.tensor_parallel_size}.")
        if self.model_impl not in ("auto", "vllm", "transformers"):
            raise ValueError(f"--model-impl must be auto, vllm or transformers, got {self.model_impl!r}.")
        if (self.max_lora_rank is None) != (not self.lora_target_modules):
            raise ValueError(
                "--max-lora-rank and --lora-target-modules go together (adapter-only weight sync)."
            )

    def engine_kwargs(self) -> dict:
        """`ColocatedEngine` keyword arguments (the options above carry the engine's own argument names)."""
        names = ("tensor_parallel_size", "dtype", "max_model_len", "max_num_seqs", "gpu_memory_utilization")
        names += ("enforce_eager", "seed", "trust_remote_code", "model_impl")
        lora = None
        if self.max_lora_rank:
            from ..engine.lora import serving_settings

            lora = serving_settings(self.max_lora_rank, list(self.lora_target_modules))
        return {**{name: getattr(self, name) for name in names}, "lora": lora}
