#!/usr/bin/env sh
# vLLM for configs/examples/envoy-ai-gateway-guardrail.yaml, with its OpenTelemetry traces switched on.
export OTEL_EXPORTER_OTLP_TRACES_INSECURE=true
export OTEL_SERVICE_NAME=vllm
exec vllm serve meta-llama/Llama-3.1-8B-Instruct \
  --host 127.0.0.1 --port 8000 \
  --otlp-traces-endpoint grpc://127.0.0.1:4317
