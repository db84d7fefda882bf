# cdigen: the CDI generator, policy engine and kubelet device plugin in one image.
#   docker build -t registry.example.com/cdigen:v0.1.0 --build-arg VERSION=0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" --build-arg SOURCE="$(git remote get-url origin)" .
# (tags are v<version>; the build args fill the OCI labels version, revision and source)
# Every dependency ships as a binary wheel, so neither stage needs a compiler; the build stage
# exists to keep pip's caches, the source tree and setuptools out of the final image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cdigen/ cdigen/
COPY policies/ policies/
COPY plugin/ plugin/
COPY schemas/ schemas/
COPY deploy/dra/deviceclasses.yaml deploy/dra/
RUN python -m venv /opt/cdigen \
    && /opt/cdigen/bin/pip install --no-cache-dir . \
    && /opt/cdigen/bin/pip uninstall --yes pip \
    && /opt/cdigen/bin/cdigen --version

FROM ${PYTHON_IMAGE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="cdigen" \
      org.opencontainers.image.description="CDI specs, topology-aware GPU allocation policies and a Kubernetes device plugin for NVIDIA GPUs" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
COPY --from=build /opt/cdigen /opt/cdigen
ENV PATH=/opt/cdigen/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default. The DaemonSet runs the plugin as uid 0 on purpose (the kubelet's plugin
# directory and /var/run/cdi belong to root, and NVML needs the GPUs: see docs/install.md).
USER 65532:65532
ENTRYPOINT ["cdigen"]
CMD ["--help"]
