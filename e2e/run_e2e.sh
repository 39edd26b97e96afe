#!/usr/bin/env bash
# End-to-end run of DSpark with the sglang-dspark-dp plugin on real
# `sglang serve` servers, on the tiny DeepSeek-V4 models of e2e/models with
# dummy weights at a real model's init scale (e2e/hook, e2e only).
#
#   e2e/run_e2e.sh --gpus 1|2|4 [--release 16|17] [--only PART]... [--out DIR]
#                  [--pack-to DIR] [--sglang-site PATHS] [--python PY]
#                  [--port P] [--gsm8k-data DIR] [--rounds N] [--no-doctor]
#
# Parts, in this order unless --only picks some (repeatable):
#   dspark    DSpark + plugin, the consensus watch on
#             (SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1: rows "watch: no alarm"
#             and, where a rank alarmed, "watch: alarm line readable")
#   noplugin  DSpark, plugin off (SGLANG_PLUGINS=e2e_init: SGLang loads only
#             the e2e init hook and logs that it skips the plugin)
#   nospec    no speculation (plugin on)
#   report    cross-server rows (greedy identical, bench ratios) and the
#             merged e2e_results.{json,md}
#   warmup    (only when named) a DSpark server plugin off, then one plugin
#             on, each until /health and one bench_serving round, stopped:
#             a fresh machine's first server pays the kernels' first-time
#             JIT (minutes, at capture and again at serving's new shapes),
#             and the first plugin-on server its own kernels, so the servers
#             compared start warm; a row per server, its ready seconds
#   restart   (only when named) a DSpark server plugin off, then one on,
#             each until /health, stopped: a second ready time per variant
#             for the report's ready-time row (on - off within the spread)
# Every server part runs the same checks in the same order before its
# bench_serving rounds (stream, 32 concurrent, greedy), so the servers'
# histories before the rounds are alike; GSM8K (dspark) runs after them.
# Each part records its rows in DIR/rows-PART.json, so parts can run in
# separate device calls (DIR survives between calls on one machine; what a
# call packed to --pack-to comes back). --gpus 2|4: DP attention + EP over
# all GPUs (attention TP 1); --gpus 1: TP 1.
# Sites: --release takes scripts/device/unpack.py's site (default 17);
# --sglang-site a PYTHONPATH of your own.
set -euo pipefail

# NVLink multicast stays off on the lent machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The tiny model is unquantized bf16; the fp8 wo_a GEMM needs an fp8 checkpoint.
export SGLANG_OPT_FP8_WO_A_GEMM="${SGLANG_OPT_FP8_WO_A_GEMM:-0}"
export PYTHONUNBUFFERED=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GPUS=""
RELEASE=17
SITE=""
OUT="$ROOT/e2e/out"
PACK_TO=""
PY="${PYTHON:-python3}"
PORT=31000
GSM8K_DATA=""
ROUNDS=3
DOCTOR=1
PARTS=()
HEALTH_TIMEOUT="${E2E_HEALTH_TIMEOUT:-420}"
PORT_WAIT="${E2E_PORT_WAIT:-20}"
GRACE=20

while (($#)); do
  case "$1" in
    --gpus) GPUS="$2"; shift 2 ;;
    --release) RELEASE="$2"; shift 2 ;;
    --only) PARTS+=("$2"); shift 2 ;;
    --sglang-site) SITE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --pack-to) PACK_TO="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --gsm8k-data) GSM8K_DATA="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --no-doctor) DOCTOR=0; shift ;;
    -h|--help) sed -n 2,34p "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
case "$GPUS" in 1|2|4) ;; *) echo "--gpus must be 1, 2 or 4 (got '$GPUS')" >&2; exit 2 ;; esac
case "$ROUNDS" in ''|*[!0-9]*|0) echo "--rounds must be a positive integer (got '$ROUNDS')" >&2; exit 2 ;; esac
case "$RELEASE" in 16|17) ;; *) echo "--release must be 16 or 17 (got '$RELEASE')" >&2; exit 2 ;; esac
((${#PARTS[@]})) || PARTS=(dspark noplugin nospec report)
for p in "${PARTS[@]}"; do
  case "$p" in dspark|noplugin|nospec|report|warmup|restart) ;;
    *) echo "--only must be dspark, noplugin, nospec, report, warmup or restart (got '$p')" >&2
      exit 2 ;;
  esac
done
# Graph batch sizes: one GPU captures 1-8 (the issue-24 start-up budget);
# the DP runs capture up to 128 as before.
if [[ $GPUS == 1 ]]; then GRAPH_BS=8; else GRAPH_BS=128; fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$ROOT"
STATE="${DSDP_STATE:-/tmp/dsdp}"
if [[ -z "$GSM8K_DATA" ]]; then
  for d in "$STATE/extras/gsm8k" "$ROOT/../shared/data/gsm8k"; do
    if [[ -f "$d/test.jsonl" ]]; then GSM8K_DATA="$d"; break; fi
  done
fi
if [[ -z "$SITE" ]]; then SITE="$("$PY" scripts/device/unpack.py pythonpath "$RELEASE")"; fi
# The e2e init hook (its own entry point, e2e only) and the site.
export PYTHONPATH="$ROOT/e2e/hook:$SITE${PYTHONPATH:+:$PYTHONPATH}"
URL="http://127.0.0.1:$PORT"
TARGET="$ROOT/e2e/models/tiny-dsv4-target"
DRAFT="$ROOT/e2e/models/tiny-dsv4-dspark-draft"

checks() { "$PY" "$ROOT/e2e/e2e_checks.py" "$@"; }
# check PART NAME SUBCOMMAND ARGS...: one row in the part's results file.
check() {
  local part="$1" name="$2"; shift 2
  checks --results "$OUT/rows-$part.json" --check "$part: $name" "$@" || true
}
check_rc() {  # like check, with the check's exit status
  local part="$1" name="$2"; shift 2
  checks --results "$OUT/rows-$part.json" --check "$part: $name" "$@"
}
not_run() {  # not_run PART WHY NAME...
  local part="$1" why="$2"; shift 2
  for name in "$@"; do
    checks --results "$OUT/rows-$part.json" --check "$part: $name" record \
      --status "not run" --evidence "$why" >/dev/null || true
  done
}

SERVER_PID=""
# The server's process group is recorded in OUT (which outlives a call on
# one machine): a call cut at its limit never reaches stop_server, and its
# server would answer the next part's checks on the same port.
PGID_FILE="$OUT/server.pgid"
stop_stale() {
  [[ -s "$PGID_FILE" ]] || return 0
  local pgid
  pgid="$(cat "$PGID_FILE")"
  if [[ $pgid =~ ^[0-9]+$ ]] && kill -0 -- "-$pgid" 2>/dev/null; then
    echo "run_e2e.sh: stopping the server left by an earlier call (process group $pgid)" >&2
    kill -TERM -- "-$pgid" 2>/dev/null || true
    for _ in $(seq "$GRACE"); do
      kill -0 -- "-$pgid" 2>/dev/null || break
      sleep 1
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
    sleep 1
  fi
  rm -f "$PGID_FILE"
}
stop_server() {
  [[ -n "$SERVER_PID" ]] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
    for _ in $(seq "$GRACE"); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 1
    done
  fi
  # Children left in the group (schedulers, detokenizer) go too.
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  rm -f "$PGID_FILE"
}
pack() {  # pack PART: everything so far as one file, and the part's rows
  # (the device returns 8 files at most).
  [[ -n "$PACK_TO" ]] || return 0
  mkdir -p "$PACK_TO"
  tar -C "$OUT" -cJf "$PACK_TO/e2e.tar.xz" . 2>/dev/null || true
  cp "$OUT/rows-$1.json" "$PACK_TO/" 2>/dev/null || true
}
trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM

# What the `sglang` console script runs; argv[0] is -c, the rest is ours.
SGLANG_MAIN='import sys; from sglang.cli.main import main; sys.exit(main())'
start_server() {  # start_server LOG SPEC(yes|no) [env KEY=VAL ...]
  local log="$1" spec="$2"; shift 2
  local args
  mapfile -t args < <(checks server-args --gpus "$GPUS" --spec "$spec" \
    --port "$PORT" --target "$TARGET" --draft "$DRAFT" --graph-bs "$GRAPH_BS")
  echo "+ ${*:+$* }sglang ${args[*]}" >"$log"
  # setsid: its own process group, stopped as a whole by stop_server.
  setsid env "$@" "$PY" -c "$SGLANG_MAIN" "${args[@]}" >>"$log" 2>&1 &
  SERVER_PID=$!
  echo "$SERVER_PID" >"$PGID_FILE"
}

# port_taken: something still listens on PORT after up to PORT_WAIT s (a
# server an earlier, cut call left running would answer this part's checks
# in its place). A port in TIME_WAIT (the previous part's server stopped a
# moment ago) is not taken: the server binds with SO_REUSEADDR, and so does
# the check (e2e_checks.port_state). PORT_WHY: what the check saw.
PORT_WHY=""
port_taken() {
  local rc=0
  PORT_WHY="$(checks port --port "$PORT" --wait "$PORT_WAIT")" || rc=$?
  echo "run_e2e.sh: $PORT_WHY" >&2
  ((rc != 0))
}

# bench_rounds PART N: N sglang.benchmark.serving rounds (arguments:
# e2e_checks.bench_args) into OUT/bench_PART.jsonl, with e2e/bench_shim's
# stand-in for the `datasets` it imports and the device lacks.
bench_rounds() {
  local part="$1" n="$2" i bargs
  mapfile -t bargs < <(checks bench-args --port "$PORT" --tokenizer "$TARGET" \
    --output-file "$OUT/bench_$part.jsonl")
  for i in $(seq "$n"); do
    PYTHONPATH="$ROOT/e2e/bench_shim:$PYTHONPATH" "$PY" -m sglang.benchmark.serving \
      "${bargs[@]}" >>"$OUT/bench_$part.out" 2>&1 || true
  done
}

# run_part PART SPEC ENV...: one server and its checks.
run_part() {
  local part="$1" spec="$2"; shift 2
  local log="$OUT/server_$part.log" plugin=on variant=on
  [[ $part == noplugin ]] && plugin=off variant=off
  [[ $spec == no ]] && variant=nospec
  rm -f "$OUT/rows-$part.json" "$OUT/bench_$part.jsonl"
  stop_stale
  if port_taken; then
    echo "run_e2e.sh: port $PORT is already in use (a server left by an earlier call?);" \
      "not starting $part, whose checks would reach that server instead" >&2
    not_run "$part" "port $PORT was already in use by another process (${PORT_WHY#*: })" \
      "/health (server ready)" "plugin log lines" "CUDA graph capture" \
      "streaming request 200" "32 concurrent requests 200" "greedy outputs"
    pack "$part"
    return 1
  fi
  start_server "$log" "$spec" "$@"
  if ! check_rc "$part" "/health (server ready)" health --url "$URL" \
      --timeout "$HEALTH_TIMEOUT" --pid "$SERVER_PID" --variant "$variant"; then
    stop_server
    if [[ $part == noplugin && $GPUS != 1 && $RELEASE == 16 ]]; then
      # 0.5.16 under DP attention without the repair: the known crash.
      check "$part" "expected crash in log" expect-crash --log "$log" --healthy no
    fi
    not_run "$part" "server never became healthy; see server_$part.log" \
      "plugin log lines" "CUDA graph capture" "streaming request 200" \
      "32 concurrent requests 200" "greedy outputs" "decode on CUDA graph"
    pack "$part"
    return 0
  fi
  check "$part" "plugin log lines" plugin-lines --log "$log" --plugin "$plugin" \
    --dspark "$spec"
  if [[ $spec == yes ]]; then
    check "$part" "CUDA graph capture (target + draft)" capture --log "$log"
  else
    check "$part" "CUDA graph capture (target)" capture --log "$log" --no-require-draft
  fi
  check "$part" "streaming request 200" stream --url "$URL"
  check "$part" "32 concurrent requests 200" concurrent --url "$URL" --n 32
  check "$part" "greedy outputs" greedy --url "$URL" --save "$OUT/greedy_$part.json"
  check "$part" "greedy outputs differ by prompt" diversity "$OUT/greedy_$part.json"
  bench_rounds "$part" "$ROUNDS"
  check "$part" "bench_serving $ROUNDS rounds" bench --file "$OUT/bench_$part.jsonl" \
    --rounds "$ROUNDS"
  if [[ $part == dspark ]]; then
    if [[ -n "$GSM8K_DATA" ]]; then
      "$PY" -m sglang_dspark_dp_bench.gsm8k.client --port "$PORT" \
        --num-questions 50 --parallel 16 --no-progress --data-path "$GSM8K_DATA" \
        --result-file "$OUT/gsm8k_$part.json" >"$OUT/gsm8k_$part.out" 2>&1 || true
      check "$part" "GSM8K 50 q, zero request errors" gsm8k \
        --result-file "$OUT/gsm8k_$part.json"
    else
      not_run "$part" "no GSM8K data (carry it: scripts/device/README.md)" \
        "GSM8K 50 q, zero request errors"
    fi
  fi
  sleep 3  # the last decode log lines
  check "$part" "decode on CUDA graph" decode-graph --log "$log" --dp "$GPUS"
  if [[ $spec == yes ]]; then
    check "$part" "accept length" accept --log "$log" --greedy "$OUT/greedy_$part.json"
  fi
  if [[ $part == dspark ]]; then
    # The consensus watch was on (SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1):
    # no rank may have alarmed; an alarm line must read part by part.
    check "$part" "watch: no alarm" watch --log "$log" --gpus "$GPUS"
    if grep -q "sglang-dspark-dp: watch: ranks" "$log"; then
      check "$part" "watch: alarm line readable" alarm-format --log "$log"
    else
      not_run "$part" "no alarm line to read (the ranks agreed)" \
        "watch: alarm line readable"
    fi
  fi
  stop_server
  pack "$part"
}

# ready_server PART VARIANT BENCH: a DSpark server, plugin VARIANT (on|off),
# until /health, BENCH bench_serving rounds (not checked), then stopped; its
# row "PART: /health (server ready, plugin VARIANT)". Returns 1 if the port
# was taken.
ready_server() {
  local part="$1" variant="$2" bench="$3" env=()
  local name="/health (server ready, plugin $variant)"
  [[ $variant == off ]] && env=(SGLANG_PLUGINS=e2e_init)
  stop_stale
  if port_taken; then
    echo "run_e2e.sh: port $PORT is already in use; no $part server started" >&2
    not_run "$part" "port $PORT was already in use by another process (${PORT_WHY#*: })" "$name"
    return 1
  fi
  start_server "$OUT/server_${part}_$variant.log" yes "${env[@]}"
  if check_rc "$part" "$name" health --url "$URL" --timeout "$HEALTH_TIMEOUT" \
      --pid "$SERVER_PID" --variant "$variant" && ((bench)); then
    bench_rounds "${part}_$variant" "$bench"
  fi
  stop_server
}

# warmup: both kernel sets compiled before the compared servers start. The
# first server on a machine pays the kernels' first-time JIT (minutes, at
# capture and at serving's new shapes); a plugin-on server then still
# compiles its own (2026-12-07, H200: only the first plugin-on server wrote
# new Triton kernels, 374 files, after a plugin-off warm-up). So a plugin-off
# server, then a plugin-on one, each until /health and one bench_serving
# round, then stopped.
warmup() {
  rm -f "$OUT/rows-warmup.json"
  local variant
  for variant in off on; do
    ready_server warmup "$variant" 1 || { pack warmup; return 1; }
  done
  pack warmup
}

# restart: a plugin-off server, then a plugin-on one (E2E_RESTART_VARIANTS),
# until /health and stopped: with the compared parts' servers, two ready
# times per variant, whose spread the report's ready-time row compares the
# difference with.
restart() {
  rm -f "$OUT/rows-restart.json"
  local variant
  for variant in ${E2E_RESTART_VARIANTS:-off on}; do
    ready_server restart "$variant" 0 || { pack restart; return 1; }
  done
  pack restart
}

report() {
  local r="$OUT/rows-report.json"
  rm -f "$r"
  pair() {  # pair NAME A B
    if [[ -s "$OUT/greedy_$2.json" && -s "$OUT/greedy_$3.json" ]]; then
      checks --results "$r" --check "$1" compare "$OUT/greedy_$2.json" \
        "$OUT/greedy_$3.json" || true
    else
      checks --results "$r" --check "$1" record --status "not run" \
        --evidence "greedy_$2.json or greedy_$3.json missing" || true
    fi
  }
  pair "lossless: DSpark + plugin greedy == no-spec greedy" dspark nospec
  pair "plugin harmless: DSpark + plugin greedy == DSpark plugin off" dspark noplugin
  pair "DSpark plugin off greedy == no-spec greedy" noplugin nospec
  if [[ -s "$OUT/bench_dspark.jsonl" && -s "$OUT/bench_noplugin.jsonl" ]]; then
    checks --results "$r" --check "bench: plugin / plugin off within noise" ratios \
      --plugin "$OUT/bench_dspark.jsonl" --off "$OUT/bench_noplugin.jsonl" || true
  else
    checks --results "$r" --check "bench: plugin / plugin off within noise" record \
      --status "not run" --evidence "a bench file is missing" || true
  fi
  local merge=("$OUT"/rows-dspark.json "$OUT"/rows-noplugin.json "$OUT"/rows-nospec.json
    "$OUT"/rows-restart.json)
  local have=()
  for f in "${merge[@]}"; do [[ -s $f ]] && have+=("$f"); done
  if ((${#have[@]})); then
    checks --results "$r" --check "server ready seconds" ready --merge "${have[@]}" || true
    checks --results "$r" --check "ready: plugin on - off within the same-variant spread" \
      ready-diff --merge "${have[@]}" || true
  else
    checks --results "$r" --check "server ready seconds" record --status "not run" \
      --evidence "no server part's rows" || true
  fi
  have+=("$r")
  checks --results "$OUT/e2e_results.json" report --md "$OUT/e2e_results.md" \
    --merge "${have[@]}" --meta "gpus=$GPUS" \
    --meta "sglang=$("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))')" \
    --meta "torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
    --meta "init=$("$PY" -c 'import sglang_dspark_dp_e2e_init as h; print(h.init_range())')" \
    --meta "date=$(date -u +%FT%TZ)" || true
  if [[ -n "$PACK_TO" ]]; then
    cp "$OUT/e2e_results.json" "$OUT/e2e_results.md" "$PACK_TO/" 2>/dev/null || true
  fi
  pack report
}

if ! "$PY" -c 'import sglang.cli.main, sglang_dspark_dp_bench.gsm8k.client' 2>"$OUT/import.err"; then
  echo "sglang or the benchmarks not importable with $PY (PYTHONPATH=$PYTHONPATH):" >&2
  tail -3 "$OUT/import.err" >&2
  exit 2
fi
# The plugin's own view of this SGLang, beside the rows (--no-doctor: not
# wanted, as in the CPU tests of this script's guards). Its log lines go to
# doctor.log: doctor.json stays one JSON document.
if ((DOCTOR)); then
  "$PY" -m sglang_dspark_dp.cli doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor.log" || true
fi

for part in "${PARTS[@]}"; do
  case "$part" in
    dspark) run_part dspark yes SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1 ;;
    noplugin) run_part noplugin yes SGLANG_PLUGINS=e2e_init ;;
    nospec) run_part nospec no ;;
    report) report ;;
    warmup) warmup ;;
    restart) restart ;;
  esac
done
