#!/usr/bin/env bash
# Start a real third-party stack on loopback with deltatap taps and the deltatap collector (issue 7).
#
#   realstack/start.sh                                   # Envoy -> LiteLLM (content filter) -> llama.cpp
#   realstack/start.sh configs/realstack-nginx-litellm.yaml
#   realstack/start.sh configs/realstack-envoy-reffw.yaml --no-taps
#
# Needs the parts .ci/realstack installs (under ~/.cache/deltatap) and deltatap's .venv. Ports follow
# the config (gateway 8100, firewall 8200, engine 8300, taps 9100/9200/9300, collector 4317/4318).
# Ctrl-C stops everything and writes the collector's report under runs/realstack/<name>/collector/.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/realstack-envoy-litellm.yaml}
[ $# -gt 0 ] && shift
exec .venv/bin/python realstack/launch.py "$config" "$@"
