#!/usr/bin/env sh
# llama-server for configs/examples/llamacpp-nginx.yaml. It has no OpenTelemetry exporter: the
# proxy-engine tap reads the `timings` object of its final stream chunk instead. --metrics exposes its
# Prometheus endpoint (add it to deploy/prometheus.yml if you want it in Grafana).
exec llama-server -m "${MODEL:-model.gguf}" --host 127.0.0.1 --port 8081 --metrics
