# syntax=docker/dockerfile:1
# One image for all three services; compose/k8s pick one by its console script:
#   command: ["powertrip-aggregator" | "powertrip-profiler" | "powertrip-worker"]
# (each answers --help with the POWERTRIP_* variables it reads)
#
# Where the pieces come from, by build argument (docs/images.md: a registry or index mirror):
#   BASE_IMAGE           the base of both stages: a Debian-based image with python (3.11+) and pip
#                        on PATH, e.g. a mirror's copy of python:3.11-slim-bookworm.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST
#                        pip's own settings, in the environment of every pip call (unset: PyPI).
#   TORCH_INDEX_URL      where torch comes from (default: the PyTorch index of TORCH_INDEX); empty
#                        takes torch from PIP_INDEX_URL like every other package.
#   DEBIAN_MIRROR        replaces http://deb.debian.org in the base image's apt sources.
# Build arguments are not part of the image's environment, but the image's history records the
# ones its RUN steps saw (`podman history --no-trunc`): keep credentials out of these URLs.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
WORKDIR /src
COPY pyproject.toml README.md ./
COPY powertrip powertrip
COPY services services
COPY tc-scripts tc-scripts
# The build backend (hatchling) comes from the index too.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${BASE_IMAGE}
# torch of one build variant, by build argument:
#   TORCH_INDEX=cpu    (default) CPU only: the default PyPI wheel pulls multi-GB CUDA libraries.
#   TORCH_INDEX=cu126  CUDA 12.6: NVIDIA driver >= 525, Maxwell to Hopper GPUs (the GPU image of
#                      compose.gpu.yaml and deploy/k8s/components/gpu, tagged powertrip-cuda:dev).
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
ARG DEBIAN_MIRROR
# hadolint ignore=DL3008
RUN if [ -n "${DEBIAN_MIRROR}" ]; then \
        find /etc/apt/ \( -name '*.list' -o -name '*.sources' \) \
            -exec sed -i "s|http://deb.debian.org|${DEBIAN_MIRROR}|g" {} + ; \
    fi \
    && apt-get update \
    && apt-get install -y --no-install-recommends iproute2 \
    && rm -rf /var/lib/apt/lists/*
# Declared here, not above, so that builds for other variants or indexes share the layers before.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG TORCH_INDEX=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_INDEX}
# The build fails unless the installed torch is the variant asked for: CPU only, or the CUDA
# version TORCH_INDEX names (cu126 = CUDA 12.6), wherever the wheel came from. Without
# --index-url (TORCH_INDEX_URL empty) pip's own settings apply, a pip.conf of the base image too.
# The pin is torch==${TORCH_VERSION}; hadolint does not read it through the ${...:+...} expansion.
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX_URL:+--index-url "${TORCH_INDEX_URL}"} "torch==${TORCH_VERSION}" \
    && python -c "import os, sys, torch; \
                  cuda = torch.version.cuda; \
                  got = 'cu' + cuda.replace('.', '') if cuda else 'cpu'; \
                  want = os.environ['TORCH_INDEX']; \
                  sys.exit(None if got == want else f'torch {torch.__version__} is {got}, not {want}')"
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
