#!/usr/bin/env sh
# vLLM for configs/examples/vllm-litellm.yaml, with its OpenTelemetry traces switched on.
# The llm_request span it emits carries the engine's own queue / prefill / decode times
# (gen_ai.latency.*), which refine t6a and t7 beyond what the gw-engine tap can see on the wire.
export OTEL_EXPORTER_OTLP_TRACES_INSECURE=true
export OTEL_SERVICE_NAME=vllm
exec vllm serve meta-llama/Llama-3.1-8B-Instruct \
  --host 127.0.0.1 --port 8000 \
  --otlp-traces-endpoint grpc://127.0.0.1:4317
