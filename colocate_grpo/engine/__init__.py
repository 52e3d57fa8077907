"""The engines: `Engine` (base.py) is what the trainer and the server rely on; `ColocatedEngine` (colocated.py) is
vLLM inside this process, and the only place that reaches into vLLM (with its CPU and LoRA helpers, cpu.py and
lora.py); runtime.py holds process-level setup (threads, groups, dtypes), sampling.py the sampling types."""
