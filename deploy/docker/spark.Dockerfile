# syntax=docker/dockerfile:1
# The Spark image of dstl jobs (driver and executors): the official Apache Spark
# image, plus a Python with dstl and the spark extra's pyarrow and pandas.
# Build from the repository root (the build context):
#   docker build -f deploy/docker/spark.Dockerfile -t $REGISTRY/dstl-spark:0.1.0 .
#
# The Spark tag (4.3.0 below) must equal the pyspark version of pyproject.toml's
# spark extra: the JVM and the Python side of PySpark are one release, and the
# job's Python code runs against this image's pyspark (/opt/spark/python), not
# one from PyPI. tests/deploy/test_images.py checks that they match.
#
# Why a Python of our own: the official python3 variants install Ubuntu 22.04's
# python3 (3.10), below dstl's floor (requires-python >= 3.11). uv installs a
# pinned standalone CPython 3.12 instead; the driver and the executors use it
# (PYSPARK_PYTHON, PYSPARK_DRIVER_PYTHON), so their Python versions agree.
#
# `make image-test` does not build this image: its base is the Apache Spark
# distribution (JVM, Spark's jars, /opt/spark, uid 185), which Debian does not
# package, and `uv python install` downloads CPython from GitHub (docs/deploy.md).
# Push it to a registry of your own: nothing is published under ghcr.io/dstl-project.

# ---- builder: the dstl wheel, and uv
FROM python:3.12-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY dstl_client ./dstl_client
COPY dstl_server ./dstl_server
COPY deploy/docker/constraints.txt ./
# the versions every package installed below must have (tools/image_constraints.py)
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && cp constraints.txt /wheels/ \
    && pip install --no-cache-dir uv==0.13.9

# ---- runtime
FROM apache/spark:4.3.0-scala2.13-java17-ubuntu

ARG DSTL_VERSION=0.1.0

LABEL org.opencontainers.image.title="dstl-spark" \
      org.opencontainers.image.description="Apache Spark 4.3.0 with dstl (keyed state on the Durable Short-term Log) for PySpark jobs" \
      org.opencontainers.image.version="${DSTL_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/dstl-project/dstl" \
      org.opencontainers.image.base.name="docker.io/apache/spark:4.3.0-scala2.13-java17-ubuntu"

USER 0

ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_BIN_DIR=/opt/python/bin \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_NO_CACHE=1

# CPython 3.12 (uv's pinned build) in /opt/python, a virtual environment in
# /opt/dstl with dstl and the spark extra's pyarrow and pandas (pyspark itself
# is the image's). uv and the wheel come from bind mounts: not in the image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=bind,from=builder,source=/usr/local/bin/uv,target=/usr/local/bin/uv \
    uv python install 3.12 \
    && uv venv --python 3.12 /opt/dstl \
    && uv pip install --python /opt/dstl/bin/python --constraint=/wheels/constraints.txt \
       "/wheels/dstl-${DSTL_VERSION}-py3-none-any.whl" "pyarrow>=15" "pandas<3"

ENV PATH=/opt/dstl/bin:${PATH} \
    PYSPARK_PYTHON=/opt/dstl/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/dstl/bin/python \
    PYTHONDONTWRITEBYTECODE=1

# Spark's own user (uid and gid 185, made by the base image): the group the
# sidecar's Unix socket belongs to in the chart (unixSocket.gid).
USER 185
