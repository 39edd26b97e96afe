#!/usr/bin/env bash
# Multi-GPU end-to-end run of DSpark + DP attention + EP with the
# sglang-dspark-dp plugin, on the tiny dummy-weight DeepSeek-V4 models of
# e2e/models. Needs >= 2 GPUs. Writes $OUT/e2e_results.{json,md}.
#
#   e2e/run_e2e.sh --gpus 2|4 [--sglang-site DIR] [--out DIR]
#                  [--compare-0517 SITE] [--python PY] [--port P]
#                  [--gsm8k-data DIR]
#
# PY needs the plugin and the benchmarks installed (pip install -e . -e benchmark).
set -euo pipefail

# NVLink multicast stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The tiny model is unquantized bf16; the fp8 wo_a GEMM needs an fp8 checkpoint.
export SGLANG_OPT_FP8_WO_A_GEMM="${SGLANG_OPT_FP8_WO_A_GEMM:-0}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUS=2
SITE=""
OUT="$ROOT/e2e/out"
SITE_0517=""
PY="${PYTHON:-python}"
PORT=31000
# Folder with GSM8K train.jsonl + test.jsonl (the GPU machines reach no
# network, so the client cannot download them); default: the checkout's
# ../shared/data/gsm8k when present, else the client's own cache.
GSM8K_DATA=""
HEALTH_TIMEOUT="${E2E_HEALTH_TIMEOUT:-1200}"
CRASH_TIMEOUT="${E2E_CRASH_TIMEOUT:-900}"
GRACE=30

while (($#)); do
  case "$1" in
    --gpus) GPUS="$2"; shift 2 ;;
    --sglang-site) SITE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --compare-0517) SITE_0517="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --gsm8k-data) GSM8K_DATA="$2"; shift 2 ;;
    -h|--help) sed -n 2,10p "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$GPUS" in 2|4) ;; *) echo "--gpus must be 2 or 4" >&2; exit 2 ;; esac

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
if [[ -z "$GSM8K_DATA" && -f "$ROOT/../shared/data/gsm8k/test.jsonl" ]]; then
  GSM8K_DATA="$ROOT/../shared/data/gsm8k"
fi
GSM8K_ARGS=()
if [[ -n "$GSM8K_DATA" ]]; then GSM8K_ARGS=(--data-path "$GSM8K_DATA"); fi
RESULTS="$OUT/e2e_results.json"
rm -f "$RESULTS"
URL="http://127.0.0.1:$PORT"
TARGET="$ROOT/e2e/models/tiny-dsv4-target"
DRAFT="$ROOT/e2e/models/tiny-dsv4-dspark-draft"
BASE_PYTHONPATH="${PYTHONPATH:-}"

set_site() {  # set_site DIR: staged wheels first on PYTHONPATH
  export PYTHONPATH="${1:+$1${BASE_PYTHONPATH:+:}}$BASE_PYTHONPATH"
}
set_site "$SITE"

checks() { "$PY" "$ROOT/e2e/e2e_checks.py" --results "$RESULTS" "$@"; }
rec() { checks --check "$1" record --status "$2" --evidence "$3" || true; }

SERVER_PID=""
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
    for _ in $(seq "$GRACE"); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  fi
  # Children left in the group (schedulers, detokenizer) go too.
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}
trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

# start_server LOG SPEC(yes|no) [extra env KEY=VAL ...]
start_server() {
  local log="$1" spec="$2"; shift 2
  local args=(serve --model-path "$TARGET" --load-format dummy
    --tp-size "$GPUS" --dp-size "$GPUS" --enable-dp-attention
    --enable-dp-lm-head --ep-size "$GPUS" --cuda-graph-max-bs-decode 128
    --host 127.0.0.1 --port "$PORT" --mem-fraction-static 0.5
    --context-length 4096)
  if [[ "$spec" == yes ]]; then
    args+=(--speculative-algorithm DSPARK
      --speculative-draft-model-path "$DRAFT")
  fi
  echo "+ $* sglang ${args[*]}" >"$log"
  # setsid: own process group, so the whole tree is stopped together.
  setsid env "$@" "$PY" -c "$SGLANG_MAIN" "${args[@]}" >>"$log" 2>&1 &
  SERVER_PID=$!
}

# What the `sglang` console script runs; argv[0] is -c, the rest is ours.
SGLANG_MAIN='import sys; from sglang.cli.main import main; sys.exit(main())'
if ! "$PY" -c 'import sglang.cli.main' 2>/dev/null; then
  echo "sglang.cli.main not importable with $PY (PYTHONPATH=$PYTHONPATH)" >&2
  exit 2
fi

if ! "$PY" -c 'import sglang_dspark_dp_bench.gsm8k.client' 2>/dev/null; then
  echo "sglang_dspark_dp_bench not importable with $PY: pip install -e $ROOT/benchmark" >&2
  exit 2
fi

"$PY" -m sglang_dspark_dp.cli doctor --json >"$OUT/doctor.json" 2>&1 || true

# ---- 1. DSpark + DP attention + EP, plugin on
LOG="$OUT/server_dspark.log"
start_server "$LOG" yes
if checks --check "dspark: /health" health --url "$URL" \
    --timeout "$HEALTH_TIMEOUT" --pid "$SERVER_PID"; then
  checks --check "dspark: target+draft CUDA graph captured" capture --log "$LOG" || true
  checks --check "dspark: streaming request 200" stream --url "$URL" || true
  checks --check "dspark: 32 concurrent requests 200" concurrent --url "$URL" \
    --n 32 || true
  checks --check "dspark: greedy outputs" greedy --url "$URL" \
    --save "$OUT/greedy_dspark.json" || true
  "$PY" -m sglang_dspark_dp_bench.gsm8k.client --port "$PORT" --num-questions 50 \
    --parallel 16 --no-progress --result-file "$OUT/gsm8k_dspark.json" \
    "${GSM8K_ARGS[@]}" >"$OUT/gsm8k_dspark.out" 2>&1 || true
  checks --check "dspark: GSM8K 50 q, zero request errors" gsm8k \
    --result-file "$OUT/gsm8k_dspark.json" || true
  sleep 5  # let the last decode log lines land
  checks --check "dspark: every DP rank decodes on CUDA graph" decode-graph \
    --log "$LOG" --dp "$GPUS" || true
else
  for c in "target+draft CUDA graph captured" "streaming request 200" \
      "32 concurrent requests 200" "greedy outputs" \
      "GSM8K 50 q, zero request errors" "every DP rank decodes on CUDA graph"; do
    rec "dspark: $c" "not run" "server never became healthy; see $LOG"
  done
fi
stop_server

# ---- 2. same server without speculation: greedy reference
LOG="$OUT/server_nospec.log"
start_server "$LOG" no
if checks --check "no-spec: /health" health --url "$URL" \
    --timeout "$HEALTH_TIMEOUT" --pid "$SERVER_PID"; then
  checks --check "no-spec: greedy outputs" greedy --url "$URL" \
    --save "$OUT/greedy_nospec.json" || true
fi
stop_server
if [[ -s "$OUT/greedy_dspark.json" && -s "$OUT/greedy_nospec.json" ]]; then
  checks --check "lossless: DSpark greedy == no-spec greedy" compare \
    "$OUT/greedy_dspark.json" "$OUT/greedy_nospec.json" || true
else
  rec "lossless: DSpark greedy == no-spec greedy" "not run" \
    "a greedy output file is missing"
fi

# ---- 3. plugin disabled: the unrepaired crash is expected
LOG="$OUT/server_noplugin.log"
start_server "$LOG" yes SGLANG_PLUGINS=none_such
HEALTHY=no
if checks --check "no-plugin: /health (expected to fail)" health --url "$URL" \
    --timeout "$CRASH_TIMEOUT" --pid "$SERVER_PID"; then
  HEALTHY=yes
  # Serving traffic is what reaches the broken draft path.
  checks concurrent --url "$URL" --n 8 >/dev/null 2>&1 || true
  sleep 5
fi
stop_server
checks --check "no-plugin: expected crash in log" expect-crash --log "$LOG" \
  --healthy "$HEALTHY" || true

# ---- 4. optional: SGLang 0.5.17, outputs identical with and without plugin
if [[ -n "$SITE_0517" ]]; then
  set_site "$SITE_0517"
  for mode in plugin noplugin; do
    LOG="$OUT/server_0517_$mode.log"
    if [[ $mode == plugin ]]; then start_server "$LOG" yes
    else start_server "$LOG" yes SGLANG_PLUGINS=none_such; fi
    if checks --check "0.5.17 $mode: /health" health --url "$URL" \
        --timeout "$HEALTH_TIMEOUT" --pid "$SERVER_PID"; then
      checks --check "0.5.17 $mode: greedy outputs" greedy --url "$URL" \
        --save "$OUT/greedy_0517_$mode.json" || true
    fi
    stop_server
  done
  if [[ -s "$OUT/greedy_0517_plugin.json" && -s "$OUT/greedy_0517_noplugin.json" ]]
  then
    checks --check "0.5.17: plugin greedy == no-plugin greedy" compare \
      "$OUT/greedy_0517_plugin.json" "$OUT/greedy_0517_noplugin.json" || true
  else
    rec "0.5.17: plugin greedy == no-plugin greedy" "not run" \
      "a 0.5.17 server did not become healthy"
  fi
  set_site "$SITE"
else
  rec "0.5.17: plugin greedy == no-plugin greedy" "not run" \
    "--compare-0517 not given"
fi

checks report --md "$OUT/e2e_results.md" --meta "gpus=$GPUS" \
  --meta "sglang=$("$PY" -c 'import sglang; print(sglang.__version__)')" \
  --meta "date=$(date -u +%FT%TZ)"
