# Two entry points for a fresh machine: `make experiment` and `make test`.
# Both create .venv on first use. torch is installed first and on its own, at the Dockerfile's
# version, from PyPI (plus pip's configured find-links/indexes) unless TORCH_INDEX names a PyTorch
# index. PyPI's torch for Linux x86_64 is the CUDA 13.0 build: it runs on a CPU, and uses a GPU
# with NVIDIA driver >= 580. Where nvidia-smi reports an older driver, TORCH_INDEX defaults to the
# CUDA 12.6 build (driver >= 525); where it finds a GPU, the set-up warns if torch cannot use it.
# A torch already in the venv is kept (`make clean` to replace it). Overrides:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu     CPU-only wheel (no CUDA libs)
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cu130   another CUDA build
#   make test NVIDIA_DRIVER=                                       ignore the GPU
#   make test TORCH_SPEC='torch==X'                                another version
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
TORCH_SPEC ?= torch==$(TORCH_VERSION)
ifeq ($(origin NVIDIA_DRIVER),undefined)
# The driver's major version; empty without a GPU (nvidia-smi missing or failing).
NVIDIA_DRIVER := $(shell v=$$(nvidia-smi --query-gpu=driver_version --format=csv,noheader \
  2>/dev/null) && printf '%s' "$${v%%.*}" | tr -cd 0-9)
endif
ifeq ($(origin TORCH_INDEX),undefined)
TORCH_INDEX := $(if $(NVIDIA_DRIVER),$(shell [ $(NVIDIA_DRIVER) -lt 580 ] \
  && echo https://download.pytorch.org/whl/cu126))
endif
OUTPUT ?= results/quick
# pytest-xdist workers for `make test`: more than the cores, since most tests wait on sockets and
# child processes; each test file stays on one worker (its module fixtures start once).
# TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 3

.PHONY: experiment test gpu-check lint clean certs certs-renew certs-modes

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	@echo "== installing $(TORCH_SPEC) into $(VENV) (a CPU wheel is ~200 MB; a CUDA build, several GB)"
	$(PY) -c "import torch" 2>/dev/null \
	  || $(PY) -m pip install --progress-bar on $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(if $(NVIDIA_DRIVER),$(PY) -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
	  || echo "WARNING: this torch cannot use the GPU; see TORCH_INDEX in the Makefile" >&2)
	@echo "== installing powertrip and its dependencies (editable, with the dev tools)"
	$(PY) -m pip install --progress-bar on -e ".[dev]"
	touch $@

# The tests also cover the optional parts (Flower strategy, TensorBoard export, speech workloads).
$(VENV)/.installed-extras: $(VENV)/.installed
	@echo "== installing the optional parts the tests cover (flower, tensorboard, speech)"
	$(PY) -m pip install --progress-bar on -e ".[dev,flower,tensorboard,speech]"
	touch $@

experiment: $(VENV)/.installed
	$(VENV)/bin/powertrip experiment --preset quick --threads 1 --output $(OUTPUT) --resume

test: $(VENV)/.installed-extras
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p powertrip
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

# Every GPU check in one step (CUDA tests, the quick study on CUDA, the GPU benchmarks), one
# table at the end; on a machine with a GPU only (benchmarks/gpu_check.py).
gpu-check: $(VENV)/.installed-extras
	$(PY) benchmarks/gpu_check.py --output results/gpu-check

clean:
	rm -rf $(VENV) results

# Certificates for compose.yaml's mutual TLS (deploy/README.md "Security"): the cluster's CA
# (ca.pem, and ca.key that signs: it stays here, owner-only, and is mounted nowhere) and one pair
# per identity in ./certs (git-ignored). Peers are verified by identity name, so no host names
# are needed. Re-running adds missing workers; `make certs-renew` re-issues every pair from the
# same CA, and the running services pick the new files up without a restart. Compose
# bind-mounts the files as they are, so the services' keys are made readable by the containers'
# UID 10001 (0644) and the folder private to you (0700).
COMPOSE_WORKERS ?= worker-eu-west,worker-us-east,worker-ap-south
certs: $(VENV)/.installed
	$(VENV)/bin/powertrip certs --out certs --workers $(COMPOSE_WORKERS)
	$(MAKE) --no-print-directory certs-modes

certs-renew: $(VENV)/.installed
	$(VENV)/bin/powertrip certs --out certs --renew
	$(MAKE) --no-print-directory certs-modes

certs-modes:
	chmod 700 certs && chmod 644 certs/*.key && chmod 600 certs/ca.key

# Grafana's admin password for compose.yaml (a compose file secret; Grafana has no anonymous
# access): a random one in ./secrets (git-ignored), kept if it already exists. Compose
# bind-mounts the file as it is, so it is readable by Grafana's UID 472 (0644) inside a folder
# only you can open (0700). Grafana reads it when it first creates its database: after a change,
# `docker compose down -v` (drops the dashboards' state too) or reset it in Grafana.
.PHONY: grafana-secret
grafana-secret:
	mkdir -p secrets && chmod 700 secrets
	[ -s secrets/grafana-admin-password ] || (umask 022 && openssl rand -base64 24 \
	  > secrets/grafana-admin-password)
	chmod 644 secrets/grafana-admin-password

# compose.yaml run in real containers to the quick preset's target, mutual TLS on; outside
# `make test`, since it may build the image first (minutes). Brings the stack up, waits for the
# aggregator to reach the target or fail, prints the log tail and the wall time, brings it down.
# Options and the runtime flags some hosts need: deploy/compose-check.sh --help, docs/images.md.
.PHONY: compose-check
compose-check:
	deploy/compose-check.sh
