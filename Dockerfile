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
# CPU build from the PyTorch index: the default PyPI wheel pulls multi-GB CUDA libraries.
# Same pin as the Makefile's CPU default.
ARG TORCH_VERSION=2.13.0
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    POWERTRIP_CACHE_DIR=/tmp/powertrip-cache

# iproute2 provides tc/ip for tc-scripts/ (run as root through `docker compose exec -u 0`).
# Not version-pinned: Debian drops superseded versions from its mirrors.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}"
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
