# The operator image: `celery-event-operator run` as a non-root user on a read-only root filesystem.
# Worker images do not need this: they install the base package (celery + kombu) only.
# The dev cluster (devcluster/, kmock) is a distribution of its own, for development: not in the image
# (.dockerignore leaves it out of the context; tests/test_packaging.py builds this stage's wheel and checks).
#
# No `# syntax=` line: BuildKit would pull that frontend image from a registry before building, which fails where
# builds have no registry, and this file uses nothing the builders' built-in parsers lack (docker build, BuildKit,
# buildah/podman build all read it as it is). The tests build it with buildah (devcluster/images/build.sh).
#
# Any Debian-based Python 3.11+ image works as the base (the tests use one made from Debian's own packages):
#   docker build --build-arg PYTHON_IMAGE=registry.example.com/python:3.11-slim-bookworm -t ... .

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# python3: the official images and Debian's python3 both have it (`python` only the former).
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --upgrade pip \
 && /opt/venv/bin/pip install '.[operator]'

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# Not named `operator`: every Debian base already has a group of that name (gid 37, from base-passwd).
RUN groupadd --gid 10001 celery-event-operator \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin \
        celery-event-operator
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["celery-event-operator"]
CMD ["run"]
