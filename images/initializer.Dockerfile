# syntax=docker/dockerfile:1
# kubetune initializer: `kubetune init-model` / `kubetune init-dataset`. No torch, no CUDA:
# the core dependencies only (click, huggingface_hub, boto3, pyarrow).
#   docker build -f images/initializer.Dockerfile -t kubetune-initializer:0.1.0 .
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
LABEL org.opencontainers.image.title="kubetune-initializer" \
      org.opencontainers.image.description="kubetune dataset and model initializers (no torch)" \
      org.opencontainers.image.source="https://github.com/kubetune/kubetune" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# The wheel is bind-mounted from the build stage: no layer keeps a copy of it.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir /wheels/kubetune-${VERSION}-py3-none-any.whl \
    && groupadd --system --gid 65532 kubetune \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /tmp/kubetune \
       --shell /usr/sbin/nologin kubetune
# Everything written at run time goes to /workspace (the PVC) or /tmp (an emptyDir or
# tmpfs): the image itself can be mounted read-only.
ENV HOME=/tmp/kubetune \
    XDG_CACHE_HOME=/tmp/kubetune/cache \
    HF_HOME=/tmp/kubetune/cache/huggingface \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KUBETUNE_WORKSPACE=/workspace
WORKDIR /workspace
USER 65532:65532
ENTRYPOINT ["kubetune"]
CMD ["--help"]
