# deltatap: taps, load generator, collector, reference stack, reports; one image, one entry point.
#
#   docker build -t deltatap .
#   docker run --rm deltatap --help
#   docker run --rm -p 9100:9100 deltatap tap ...        (see docs/reference.md for every command)
#
# Two stages: wheels are built with the compilers of the full image, the runtime image is slim
# and runs as an unprivileged user. Nothing is downloaded when a container starts.

ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# a C compiler for deltatap's accelerators (setup.py: every _*.c); the runtime image needs none
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/deltatap/venv
ENV PATH=/opt/deltatap/venv/bin:$PATH
WORKDIR /src
# dependencies first, so that a source change does not re-resolve them
COPY pyproject.toml setup.py README.md ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY deltatap ./deltatap
COPY proxy ./proxy
COPY loadgen ./loadgen
COPY collector ./collector
COPY stack ./stack
COPY configs ./configs
RUN pip install --no-deps . && deltatap --version && python -m deltatap.core.native /src

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.title="deltatap" \
      org.opencontainers.image.description="Where the time goes in an LLM serving stack: taps, load generator, collector" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 deltatap \
 && useradd --system --uid 10001 --gid deltatap --home-dir /opt/deltatap --shell /usr/sbin/nologin deltatap
COPY --from=build /opt/deltatap/venv /opt/deltatap/venv
COPY --chown=deltatap:deltatap configs /opt/deltatap/configs
RUN mkdir -p /opt/deltatap/out && chown deltatap:deltatap /opt/deltatap/out
ENV PATH=/opt/deltatap/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /opt/deltatap
USER deltatap:deltatap
# taps (edge, gw-fw, fw-engine) and their admin ports; collector OTLP gRPC/HTTP and /metrics;
# reference gateway, firewall, engine
EXPOSE 9100 9200 9300 10100 10200 10300 4317 4318 9464 8100 8200 8300
ENTRYPOINT ["deltatap"]
CMD ["--help"]
