#!/usr/bin/env bash
# One call of the device chain (scripts/device/README.md): unpack what this
# call carried (idempotent), then the steps named, in order.
#
#   bash scripts/device/chain.sh [STEP]...
#
# Steps (each needs every batch unpacked; if one is missing the machine was
# lost or a batch skipped: the call says so and exits 3):
#   smoke              import the server's modules with both sites
#   e2e:PARTS[:GPUS[:ROUNDS]]
#                      e2e/run_e2e.sh --only each of PARTS (comma list of
#                      dspark,noplugin,nospec,report,warmup,restart), 0.5.17,
#                      GPUS (default 1), ROUNDS bench_serving rounds per
#                      server (default 3); results under /tmp/e2e, packed to $OUT
#   fill:N             N back-to-back bench_fill.py compare runs (0.5.16 and
#                      0.5.17, stock and plugin) into $OUT/fill-runK.json
#   watchcost:N        N back-to-back bench_overlap.py compare runs on 0.5.17,
#                      the deployment-like cells, plugin and watch modes (the
#                      consensus watch's cost in steps/s) into
#                      $OUT/watch-overlap-runK.json
#   jitprobe:DIR       DIR (a cache folder, ~ for $HOME) moved aside, then a
#                      plugin-off server to /health (run_e2e.sh's restart
#                      part), then DIR put back: did DIR hold the JIT?
#   jit:pack           ~/.cache/tvm-ffi's module .so files (the first server's
#                      kernel JIT) into $OUT/jit-cache.tar.xz, for stage.py --jit
#   census             the files written under $HOME and /tmp since the first
#                      call, by cache folder, with their times (jit_census.py),
#                      into $OUT/jit-census.txt
# Everything is logged to $OUT/chain.log as well.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
OUTDIR="${OUT:-$ROOT/out}"
mkdir -p "$OUTDIR"
exec > >(tee -a "$OUTDIR/chain.log") 2>&1
export PYTHONUNBUFFERED=1

t0=$SECONDS
# The first call's start: jit_census.py counts the files written since.
[[ -e /tmp/dsdp-chain-start ]] || touch /tmp/dsdp-chain-start
echo "== $(date -u +%FT%TZ) chain.sh $*"
"$PY" scripts/device/unpack.py
unpacked=$?
echo "== unpack: exit $unpacked after $((SECONDS - t0)) s"
# Without steps (the calls that only carry a batch): fine unless a check failed.
if (($# == 0)); then ((unpacked == 3)) && exit 0; exit "$unpacked"; fi
if ((unpacked != 0)); then
  echo "NOT COMPLETE: a batch is missing on this machine (lost and restarted?):"
  echo "start again at call 1; nothing run"
  exit 3
fi

status=0
for step in "$@"; do
  t=$SECONDS
  case "$step" in
    smoke)
      "$PY" scripts/device/unpack.py --smoke || status=1
      nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
      ;;
    e2e:*)
      IFS=: read -r _ parts gpus rounds <<<"$step"
      only=()
      for p in ${parts//,/ }; do only+=(--only "$p"); done
      bash e2e/run_e2e.sh --gpus "${gpus:-1}" --rounds "${rounds:-3}" --release 17 "${only[@]}" \
        --out /tmp/e2e --pack-to "$OUTDIR" || status=1
      ;;
    fill:*)
      n="${step#fill:}"
      s16="$("$PY" scripts/device/unpack.py pythonpath 16)"
      s17="$("$PY" scripts/device/unpack.py pythonpath 17)"
      for k in $(seq "$n"); do
        "$PY" benchmark/draft_metadata/bench_fill.py --device cuda --iters 3000 \
          --explain --out "$OUTDIR/fill-run$k.json" compare \
          --site "0.5.16=$s16" --site "0.5.17=$s17" --modes stock plugin \
          | tail -12 || status=1
      done
      ;;
    watchcost:*)
      n="${step#watchcost:}"
      s17="$("$PY" scripts/device/unpack.py pythonpath 17)"
      for k in $(seq "$n"); do
        "$PY" benchmark/draft_metadata/bench_overlap.py --gpu-ms 10,20 --host-ms 0.3,1 \
          --modes plugin watch --out "$OUTDIR/watch-overlap-run$k.json" \
          compare --site "0.5.17=$s17" | tail -12 || status=1
      done
      ;;
    jitprobe:*)
      # One cache folder moved aside, then a plugin-off server to /health:
      # its ready seconds and capture times say whether that folder held the
      # first server's JIT. The folder is put back afterwards.
      d="${step#jitprobe:}"
      d="${d/#\~/$HOME}"
      if [[ -d $d ]]; then
        rm -rf "$d.aside" && mv "$d" "$d.aside"
        E2E_RESTART_VARIANTS=off bash e2e/run_e2e.sh --gpus 1 --release 17 --only restart \
          --no-doctor --out /tmp/e2e-jitprobe --pack-to "$OUTDIR" || status=1
        du -sh "$d" 2>/dev/null
        rm -rf "$d" && mv "$d.aside" "$d"
      else
        echo "jitprobe: $d: no such folder"; status=1
      fi
      ;;
    jit:pack)
      # SGLang's nvcc-built kernel modules (the first server's JIT), for
      # stage.py --jit: the .so of each module folder, nothing else.
      (cd "$HOME" && find .cache/tvm-ffi -name '*.so' -print0 |
        tar --null -T - -cJf "$OUTDIR/jit-cache.tar.xz") || status=1
      ls -la "$OUTDIR/jit-cache.tar.xz" 2>/dev/null
      ;;
    census)
      "$PY" scripts/device/jit_census.py --out "$OUTDIR/jit-census.txt" || status=1
      ;;
    *) echo "unknown step: $step"; status=2 ;;
  esac
  echo "== $step: $((SECONDS - t)) s"
done
echo "== chain.sh $*: exit $status after $((SECONDS - t0)) s"
exit "$status"
