# syntax=docker/dockerfile:1
# kubetune exporter: `kubetune export`. Its own image rather than the trainer's: the
# exporter requests no GPU, so it schedules on CPU nodes, where pulling the CUDA trainer
# image would cost many GB; the CPU torch build is all its adapter checks need.
#   docker build -f images/exporter.Dockerfile -t kubetune-exporter:0.1.0 .
# Build args: PYTHON_IMAGE (the base: Python 3.11), TORCH_VERSION, TORCH_INDEX_URL (where
# torch comes from: PyTorch's CPU wheel index by default; empty: pip's configured index).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kubetune ./kubetune
COPY entrypoints ./entrypoints
COPY initializers ./initializers
COPY trainer ./trainer
COPY exporter ./exporter
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /src

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
LABEL org.opencontainers.image.title="kubetune-exporter" \
      org.opencontainers.image.description="kubetune exporter: adapter / merged model with a manifest (CPU torch)" \
      org.opencontainers.image.source="https://github.com/kubetune/kubetune" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    PIP_INDEX_URL="${TORCH_INDEX_URL}" python -m pip install --no-cache-dir \
        "torch==${TORCH_VERSION}" \
    && python -m pip install --no-cache-dir "/wheels/kubetune-${VERSION}-py3-none-any.whl[export]" \
    && groupadd --system --gid 65532 kubetune \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /tmp/kubetune \
       --shell /usr/sbin/nologin kubetune
ENV HOME=/tmp/kubetune \
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
CMD ["export", "--help"]
