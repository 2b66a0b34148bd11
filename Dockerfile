# syntax=docker/dockerfile:1
# The operator image: `celery-event-operator run` as a non-root user on a read-only root filesystem.
# Worker images do not need this: they install the base package (celery + kombu) only.
# The dev cluster (devcluster/, kmock) is a distribution of its own, for development: not in the image
# (.dockerignore leaves it out of the context; tests/test_packaging.py builds this stage's wheel and checks).

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip install '.[operator]'

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
RUN groupadd --gid 10001 operator && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin operator
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["celery-event-operator"]
CMD ["run"]
