# Two entry points for a fresh machine: `make experiment` and `make test`.
# Both create .venv on first use. torch is installed first and on its own: the pinned CPU build
# where there is no NVIDIA GPU (so a CPU machine never pulls a multi-GB CUDA build), the default
# (CUDA) build where nvidia-smi is present. Override with TORCH_SPEC='torch==X' if needed.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 'torch>=2.3' || echo 'torch==2.13.0')
OUTPUT ?= results/quick

.PHONY: experiment test lint clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

experiment: $(VENV)/.installed
	$(VENV)/bin/powertrip experiment --preset quick --output $(OUTPUT)

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) results
