# syntax=docker/dockerfile:1
# kubetune all-in-one: every step in one image, for one GPU box without Kubernetes.
#   docker build -t kubetune:0.1.0 .
#   docker run --gpus all --read-only --tmpfs /tmp -u "$(id -u):$(id -g)" \
#     -v "$PWD/ws:/workspace" kubetune:0.1.0            # the tiny demo, end to end
# `kubetune local` runs the four steps as the runtimes wire them; with
# `--runtime /opt/kubetune/runtimes/base/<name>.yaml --trainjob /workspace/job.yaml` it runs
# one of our ClusterTrainingRuntimes as the controller would (docs/images.md); the
# torchtune-* drop-ins are under /opt/kubetune/runtimes/overlays/dropin/.
# Build args as the trainer image's: BASE_IMAGE, TORCH_VERSION, TORCH_INDEX_URL (empty:
# pip's configured index; the default CUDA base already has torch, so nothing is fetched).
# CPU-only: --build-arg BASE_IMAGE=python:3.11.14-slim-bookworm
#           --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
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
LABEL org.opencontainers.image.title="kubetune" \
      org.opencontainers.image.description="kubetune all-in-one: initializers, torchtune trainer, exporter and runtimes" \
      org.opencontainers.image.source="https://github.com/kubetune/kubetune" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# torch first, from the chosen index (on the CUDA base: already installed, nothing fetched).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    PIP_INDEX_URL="${TORCH_INDEX_URL}" python -m pip install --no-cache-dir \
        "torch==${TORCH_VERSION}" \
    && python -m pip install --no-cache-dir "/wheels/kubetune-${VERSION}-py3-none-any.whl[all]" \
    && kubetune install-tune --bin-dir /opt/kubetune/bin \
    && groupadd --system --gid 65532 kubetune \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /tmp/kubetune \
       --shell /usr/sbin/nologin kubetune
COPY runtimes /opt/kubetune/runtimes
COPY examples /opt/kubetune/examples
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
ENTRYPOINT ["kubetune"]
CMD ["local", "--workdir", "/workspace/kubetune-local"]
