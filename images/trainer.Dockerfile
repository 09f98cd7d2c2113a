# syntax=docker/dockerfile:1
# kubetune trainer: `tune run ...` (Kubeflow Trainer's torchtune command) and
# `kubetune train`, on a CUDA PyTorch base. Our `tune` is first on PATH (/opt/kubetune/bin);
# torchtune's own CLI is `tune-torchtune` there (both written by `kubetune install-tune`).
#   docker build -f images/trainer.Dockerfile -t kubetune-trainer:0.1.0 .
# Build args: BASE_IMAGE (Python 3.11; by default the CUDA PyTorch image, whose torch
# already satisfies the pin: nothing is fetched), TORCH_VERSION, TORCH_INDEX_URL (the
# index torch comes from when the base lacks it; empty: pip's configured index).
# CPU-only, a few GB smaller:
#   --build-arg BASE_IMAGE=python:3.11.14-slim-bookworm \
#   --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG BASE_IMAGE=pytorch/pytorch:2.13.0-cuda12.8-cudnn9-runtime

FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kubetune ./kubetune
COPY entrypoints ./entrypoints
COPY initializers ./initializers
COPY trainer ./trainer
COPY exporter ./exporter
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
LABEL org.opencontainers.image.title="kubetune-trainer" \
      org.opencontainers.image.description="kubetune trainer: torchtune 0.6.1 launcher on CUDA PyTorch" \
      org.opencontainers.image.source="https://github.com/kubetune/kubetune" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# torch first, from the chosen index: on the CUDA base it is already installed (nothing is
# fetched); then torchtune 0.6.1, torchao 0.15.0 and the rest of the pinned set.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    PIP_INDEX_URL="${TORCH_INDEX_URL}" python -m pip install --no-cache-dir \
        "torch==${TORCH_VERSION}" \
    && python -m pip install --no-cache-dir "/wheels/kubetune-${VERSION}-py3-none-any.whl[train,export]" \
    && kubetune install-tune --bin-dir /opt/kubetune/bin \
    && groupadd --system --gid 65532 kubetune \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /tmp/kubetune \
       --shell /usr/sbin/nologin kubetune
ENV PATH=/opt/kubetune/bin:${PATH} \
    HOME=/tmp/kubetune \
    XDG_CACHE_HOME=/tmp/kubetune/cache \
    HF_HOME=/tmp/kubetune/cache/huggingface \
    TORCH_HOME=/tmp/kubetune/cache/torch \
    TRITON_CACHE_DIR=/tmp/kubetune/cache/triton \
    TORCHINDUCTOR_CACHE_DIR=/tmp/kubetune/cache/inductor \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KUBETUNE_WORKSPACE=/workspace
WORKDIR /workspace
USER 65532:65532
ENTRYPOINT []
CMD ["tune", "--help"]
