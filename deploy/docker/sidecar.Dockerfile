# syntax=docker/dockerfile:1
# The dstl sidecar image: dstl-server, its runtime dependencies and nothing else.
# Build from the repository root (the build context):
#   docker build -f deploy/docker/sidecar.Dockerfile -t $REGISTRY/dstl-sidecar:0.1.0 .
# The tag is the dstl version (pyproject.toml), which is the chart's appVersion
# and so the image the chart runs by default (tests/deploy/test_images.py).
# sidecar.Dockerfile.dockerignore (next to this file) keeps the context small.
# Push it to a registry of your own and set the chart's image.repository to it
# (docs/deploy.md): nothing is published under ghcr.io/dstl-project, the chart's
# default, so that image cannot be pulled.
#
# BASE_IMAGE: a Python >= 3.11 image whose `pip` and `python` are on PATH and may
# install (not an "externally managed" system Python). The default is the public
# one; `make image-test` builds one from Debian packages (tools/image_test.py).
# The builder's pip also honours PIP_INDEX_URL, PIP_NO_INDEX and PIP_FIND_LINKS
# build arguments (a private index, or wheels made beforehand: tools/image_test.py).
ARG BASE_IMAGE=python:3.12-slim-bookworm

# ---- builder: the wheels of dstl and of its runtime dependencies
FROM ${BASE_IMAGE} AS builder

ARG PIP_INDEX_URL
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dstl_client ./dstl_client
COPY dstl_server ./dstl_server
COPY deploy/docker/constraints.txt ./
# dstl itself, then every runtime dependency (no extras: no dev, no spark), each
# at the version constraints.txt pins (tools/image_constraints.py writes it)
RUN pip wheel --constraint=constraints.txt --wheel-dir /wheels .

# ---- runtime
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
ARG DSTL_VERSION=0.1.0

LABEL org.opencontainers.image.title="dstl-sidecar" \
      org.opencontainers.image.description="dstl-server: the Durable Short-term Log sidecar for stateful PySpark jobs" \
      org.opencontainers.image.version="${DSTL_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/dstl-project/dstl" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"

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
