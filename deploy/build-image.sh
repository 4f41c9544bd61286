#!/usr/bin/env bash
# Builds the PowerTrip image (the repository's Dockerfile) once per torch variant, tags each
# IMAGE:VERSION-VARIANT (VERSION = powertrip.__version__), and with --push pushes the tags.
# docs/images.md has the whole story: mirrors, publishing, compose and kustomize.
set -euo pipefail

VARIANTS_ALL=(cpu cu126 cu130)
# Build arguments taken from the environment when not empty there (TORCH_INDEX_URL also empty).
PASSED_ARGS=(BASE_IMAGE PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST DEBIAN_MIRROR
             TORCH_INDEX_URL)

usage() {
    cat <<EOF
Usage: deploy/build-image.sh [OPTIONS] [-- EXTRA BUILD OPTIONS...]

Builds the image from the repository's Dockerfile for each torch variant and tags it
IMAGE:VERSION-VARIANT, VERSION being powertrip.__version__ (powertrip/__init__.py).

Options:
  --image NAME     image name without tag (default: \$POWERTRIP_IMAGE_NAME, else powertrip),
                   e.g. ghcr.io/ORG/powertrip
  --variant V      torch variant: ${VARIANTS_ALL[*]}; repeatable (default: cpu)
  --all            every variant
  --push           push each tag once it is built
  --tool T         docker or podman (default: \$CONTAINER_TOOL, else docker, else podman)
  --dry-run        print the commands, run nothing
  -h, --help       this text

Environment, passed as --build-arg when not empty (docs/images.md):
  BASE_IMAGE, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, DEBIAN_MIRROR,
  TORCH_INDEX_URL (set but empty: torch from PIP_INDEX_URL; a literal {variant} in it is
  replaced by the variant, e.g. https://mirror.example/pytorch/whl/{variant}).

Examples:
  deploy/build-image.sh --all --dry-run
  PIP_INDEX_URL=https://pypi.mirror.example/simple \\
    deploy/build-image.sh --image ghcr.io/ORG/powertrip --variant cpu --variant cu126 --push
EOF
}

die() {
    echo "build-image.sh: $*" >&2
    exit 2
}

# Prints a command shell-quoted, then runs it unless this is a dry run.
run() {
    printf '%q ' "$@" | sed 's/ $//'
    echo
    if [[ $dry_run -eq 0 ]]; then
        "$@"
    fi
}

image=${POWERTRIP_IMAGE_NAME:-powertrip}
variants=()
push=0
dry_run=0
tool=${CONTAINER_TOOL:-}
extra=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --image) [[ $# -ge 2 ]] || die "--image needs a value"; image=$2; shift 2 ;;
        --variant) [[ $# -ge 2 ]] || die "--variant needs a value"; variants+=("$2"); shift 2 ;;
        --all) variants=("${VARIANTS_ALL[@]}"); shift ;;
        --push) push=1; shift ;;
        --tool) [[ $# -ge 2 ]] || die "--tool needs a value"; tool=$2; shift 2 ;;
        --dry-run) dry_run=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ ${#variants[@]} -gt 0 ]] || variants=(cpu)
for variant in "${variants[@]}"; do
    [[ " ${VARIANTS_ALL[*]} " == *" $variant "* ]] \
        || die "unknown variant: $variant (one of: ${VARIANTS_ALL[*]})"
done
[[ ${image##*/} != *:* ]] || die "--image takes a name without a tag: $image"

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$repo/powertrip/__init__.py")
[[ -n $version ]] || die "no __version__ in $repo/powertrip/__init__.py"
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)

if [[ -z $tool ]]; then
    if command -v docker >/dev/null; then
        tool=docker
    elif command -v podman >/dev/null; then
        tool=podman
    elif [[ $dry_run -eq 1 ]]; then
        tool=docker
    else
        die "neither docker nor podman found (--tool)"
    fi
fi

for variant in "${variants[@]}"; do
    tag="$image:$version-$variant"
    build=("$tool" build --file "$repo/Dockerfile" --tag "$tag" --build-arg "TORCH_INDEX=$variant"
           --label "org.opencontainers.image.version=$version"
           --label "org.opencontainers.image.revision=$revision")
    for name in "${PASSED_ARGS[@]}"; do
        # Empty is passed on only for TORCH_INDEX_URL, where it means "from PIP_INDEX_URL".
        if [[ -n ${!name:-} || ($name == TORCH_INDEX_URL && -n ${!name+set}) ]]; then
            build+=(--build-arg "$name=${!name//\{variant\}/$variant}")
        fi
    done
    run "${build[@]}" "${extra[@]}" "$repo"
    if [[ $push -eq 1 ]]; then
        run "$tool" push "$tag"
    fi
done
