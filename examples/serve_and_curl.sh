#!/usr/bin/env bash
# Serve a checkpoint with ISD and query it with curl.
#   bash examples/serve_and_curl.sh [CKPT]   (default: the demo I-DLM)
set -euo pipefail
CKPT=${1:-$HOME/.cache/vllm-idlm/demo/idlm}
PORT=${PORT:-8011}
vllm serve "$CKPT" --port "$PORT" --dtype float32 --kv-cache-memory-bytes 536870912 \
  --speculative-config '{"method": "idlm", "num_speculative_tokens": 3}' &
SERVER=$!
trap 'kill $SERVER' EXIT
until curl -sf "localhost:$PORT/health" >/dev/null; do sleep 1; done

curl -s "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' -d "{
  \"model\": \"$CKPT\", \"prompt\": \"def fib(n):\\n\", \"max_tokens\": 48, \"temperature\": 0}"
echo
curl -s "localhost:$PORT/v1/chat/completions" -H 'Content-Type: application/json' -d "{
  \"model\": \"$CKPT\", \"messages\": [{\"role\": \"user\", \"content\": \"import os\"}],
  \"max_tokens\": 32, \"stream\": true}"
echo
curl -s "localhost:$PORT/metrics" | grep '^vllm:spec_decode'
