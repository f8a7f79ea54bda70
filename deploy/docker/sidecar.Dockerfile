# syntax=docker/dockerfile:1
# The dstl sidecar image: dstl-server, its runtime dependencies and nothing else.
# Build from the repository root (the build context):
#   docker build -f deploy/docker/sidecar.Dockerfile -t ghcr.io/dstl-project/dstl-sidecar:0.1.0 .
# The tag is the dstl version (pyproject.toml), which is the chart's appVersion
# and so the image the chart runs by default (tests/deploy/test_images.py).
# sidecar.Dockerfile.dockerignore (next to this file) keeps the context small.

# ---- builder: the wheels of dstl and of its runtime dependencies
FROM python:3.12-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dstl_client ./dstl_client
COPY dstl_server ./dstl_server
# dstl itself, then every runtime dependency (no extras: no dev, no spark)
RUN pip wheel --wheel-dir /wheels .

# ---- runtime
FROM python:3.12-slim-bookworm

ARG DSTL_VERSION=0.1.0

LABEL org.opencontainers.image.title="dstl-sidecar" \
      org.opencontainers.image.description="dstl-server: the Durable Short-term Log sidecar for stateful PySpark jobs" \
      org.opencontainers.image.version="${DSTL_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/dstl-project/dstl" \
      org.opencontainers.image.base.name="docker.io/library/python:3.12-slim-bookworm"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only the wheels built above, from a bind mount (they never become a layer);
# no index: nothing else can slip in. pip goes afterwards: nothing installs at
# run time. The user has a fixed uid (the chart's runAsUser) and no home or shell.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "dstl==${DSTL_VERSION}" \
    && pip uninstall --yes pip \
    && groupadd --system --gid 10001 dstl \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin dstl

USER 10001:10001

# gRPC (TCP mode, tcp.port) and Prometheus metrics (metrics.port) of the chart.
# Kubernetes probes check health (grpc.health.v1): no HEALTHCHECK here.
EXPOSE 7070 9464

ENTRYPOINT ["dstl-server"]
