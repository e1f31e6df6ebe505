#!/usr/bin/env bash
# Prefill/decode through the pool with our vLLM connector, all on 127.0.0.1:
# a mooncake_cxl master, a prefill `vllm serve` (kv_producer), a decode
# `vllm serve` (kv_consumer) and scripts/pd_proxy.py in front of them, on a
# tiny random Llama built locally (no download). Free ports; Ctrl-C or exit
# stops everything.
#   scripts/run_pd.sh [--once] [--parallel]
#     --once       send one request through the proxy, print it, stop
#     --parallel   the proxy sends to both at once (decode waits on the pool's announcements)
# Env: PYTHON (default python3; its bin dir must hold vllm and mooncake_cxl_master),
#      MODEL (an existing model dir to serve instead), RUN_PD_DIR (work dir), START_TIMEOUT (s, 600).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python3}"
PY="$(command -v "$PY")"
export PATH="$(dirname "$PY"):$PATH"
once=0; parallel=""
for a in "$@"; do
  case "$a" in
    --once) once=1 ;;
    --parallel) parallel="--parallel" ;;
    *) echo "usage: $0 [--once] [--parallel]" >&2; exit 2 ;;
  esac
done
work="${RUN_PD_DIR:-$(mktemp -d /tmp/mcxl_pd.XXXXXX)}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"
cd "$work"  # python -m puts the cwd first on sys.path: never a source checkout's mooncake_cxl/
pool="/dev/shm/mcxl_pd_$$.pool"
timeout_s="${START_TIMEOUT:-600}"
pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; done
  sleep 1
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -f "$pool"
  echo "run_pd: stopped; logs in $work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start() {  # start NAME CMD...: its own process group, output to $work/NAME.log
  local name="$1"; shift
  setsid "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!")
}
wait_http() {  # wait_http NAME URL PID
  local t0=$SECONDS
  until curl -sf -o /dev/null "$2"; do
    if ! kill -0 "$3" 2>/dev/null; then echo "run_pd: $1 exited; tail of $work/$1.log:" >&2; tail -30 "$work/$1.log" >&2; exit 1; fi
    if (( SECONDS - t0 > timeout_s )); then echo "run_pd: $1 not up after ${timeout_s}s ($work/$1.log)" >&2; exit 1; fi
    sleep 1
  done
  echo "run_pd: $1 up at $2 ($((SECONDS - t0)) s)"
}

model="${MODEL:-$work/model}"
if [ ! -e "$model/config.json" ]; then
  "$PY" -c "import sys; sys.path.insert(0, '$here'); from vllm_pd_demo import build_model; build_model('$model', 2, 1000, 2048)" >"$work/build_model.log" 2>&1
  echo "run_pd: built a tiny random Llama in $model"
fi

mport=$(free_port); pport=$(free_port); dport=$(free_port); xport=$(free_port)
MC_RPC_PORT=$mport MC_METRICS_PORT=$(free_port) start master "$here/start_master.sh" "$pool" $((1 << 30))
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$mport) 2>/dev/null && break; sleep 0.1; done
echo "run_pd: master on 127.0.0.1:$mport, pool $pool"

export VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_CPU_NUM_OF_RESERVED_CPU=1 \
       HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
kvcfg() {
  printf '{"kv_connector":"MooncakeCXLConnector","kv_connector_module_path":"mooncake_cxl.vllm","kv_role":"%s","kv_load_failure_policy":"recompute","kv_connector_extra_config":{"master_server_address":"127.0.0.1:%s"}}' "$1" "$mport"
}
# `vllm serve` itself, started as a module: vllm-cpu's `vllm` command looks up a
# package named "vllm" for --version and fails (the distribution is "vllm-cpu").
serve() {  # serve NAME PORT ROLE
  start "$1" "$PY" -m vllm.entrypoints.openai.api_server --model "$model" --host 127.0.0.1 --port "$2" --served-model-name tiny --dtype bfloat16 \
    --max-model-len 2048 --block-size 32 --enforce-eager --max-num-seqs 8 --kv-transfer-config "$(kvcfg "$3")"
}
serve prefill "$pport" kv_producer
ppid_=${pids[-1]}
serve decode "$dport" kv_consumer
dpid_=${pids[-1]}
wait_http prefill "http://127.0.0.1:$pport/health" "$ppid_"
wait_http decode "http://127.0.0.1:$dport/health" "$dpid_"
start proxy "$PY" "$here/pd_proxy.py" --port "$xport" --prefill "http://127.0.0.1:$pport" \
  --decode "http://127.0.0.1:$dport" $parallel
wait_http proxy "http://127.0.0.1:$xport/health" "${pids[-1]}"

prompt="$("$PY" -c 'print(" ".join(f"w{i}" for i in range(10, 210)))')"
echo "run_pd: proxy on http://127.0.0.1:$xport; a 200-token prompt through it:"
curl -sf "http://127.0.0.1:$xport/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"tiny\", \"prompt\": \"$prompt\", \"max_tokens\": 16, \"temperature\": 0}" | tee "$work/answer.json"
echo
grep -h "MooncakeCXLConnector: request" "$work/decode.log" | tail -3 || true
if [ "$once" = 1 ]; then exit 0; fi
echo "run_pd: running; try: curl http://127.0.0.1:$xport/v1/completions -H 'Content-Type: application/json' -d '{\"model\": \"tiny\", \"prompt\": \"w1 w2 w3\", \"max_tokens\": 8}'   (Ctrl-C stops everything)"
while true; do sleep 3600; done
