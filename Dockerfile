# syntax=docker/dockerfile:1
# One image for all three services; compose/k8s pick one by its console script:
#   command: ["powertrip-aggregator" | "powertrip-profiler" | "powertrip-worker"]
# (each answers --help with the POWERTRIP_* variables it reads)
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY powertrip powertrip
COPY services services
COPY tc-scripts tc-scripts
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim-bookworm
# torch from the PyTorch index of one build variant, by build argument:
#   TORCH_INDEX=cpu    (default) CPU only: the default PyPI wheel pulls multi-GB CUDA libraries.
#   TORCH_INDEX=cu126  CUDA 12.6: NVIDIA driver >= 525, Maxwell to Hopper GPUs (the GPU image of
#                      compose.gpu.yaml and deploy/k8s/components/gpu, tagged powertrip:dev-cu126).
#   TORCH_INDEX=cu130  CUDA 13.0: driver >= 580, Turing to Blackwell.
# The CUDA wheels bring the CUDA libraries; the host's NVIDIA container toolkit adds the driver
# (the parts NVIDIA_DRIVER_CAPABILITIES names; inert without a GPU). NVIDIA_VISIBLE_DEVICES stays
# unset: a container sees only the GPUs it was given (compose device reservation, k8s limit).
# Same version pin as the Makefile.
ARG TORCH_VERSION=2.13.0
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    POWERTRIP_CACHE_DIR=/tmp/powertrip-cache \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# iproute2 provides tc/ip for tc-scripts/ (run as root through `docker compose exec -u 0`).
# Not version-pinned: Debian drops superseded versions from its mirrors.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
# Declared here, not above, so the CPU and CUDA builds share the layers before this one.
ARG TORCH_INDEX=cpu
# The build fails unless the installed torch is the variant asked for (CUDA or not).
RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_INDEX}" "torch==${TORCH_VERSION}" \
    && python -c "import os, sys, torch; \
                  sys.exit((torch.version.cuda is None) != (os.environ['TORCH_INDEX'] == 'cpu'))"
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install /wheels/*.whl

# Fixed UID/GID: the k8s manifests set runAsUser/fsGroup 10001 to match.
RUN groupadd --system --gid 10001 powertrip \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
       --shell /usr/sbin/nologin powertrip \
    && install -d -o 10001 -g 10001 /var/lib/powertrip/checkpoints
WORKDIR /tmp
USER 10001:10001
EXPOSE 50051 8000
CMD ["powertrip", "--help"]
