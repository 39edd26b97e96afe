#!/usr/bin/env bash
# On the device: install the staged wheels (/tmp/wheels) into two --target
# trees, /tmp/site16 (SGLang 0.5.16) and /tmp/site17 (SGLang 0.5.17), from
# scripts/device/wheels.lock, offline and without dependency resolution, then
# smoke-import the DSpark draft module and decode_cuda_graph_runner in each.
#
#   scripts/device/install_on_device.sh [WHEELS_DIR]   (default /tmp/wheels)
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WHEELS="${1:-/tmp/wheels}"
LOCK="$ROOT/scripts/device/wheels.lock"
PY="${PYTHON:-python3}"
status=0

wheel_for() {  # NAME==VERSION -> path of its wheel in $WHEELS
  local name="${1%%==*}" ver="${1##*==}" norm
  norm="$(echo "$name" | tr 'A-Z-.' 'a-z__')"
  for f in "$WHEELS"/*.whl; do
    local base; base="$(basename "$f" | tr 'A-Z' 'a-z')"
    if [[ "$base" == "${norm}-${ver}-"* ]]; then echo "$f"; return 0; fi
  done
  return 1
}

section() {  # print the entries of [NAME] in the lock file
  awk -v s="[$1]" '/^\[/{on=($0==s); next} on && NF && !/^#/' "$LOCK"
}

for tgt in site16 site17; do
  dest="/tmp/$tgt"
  files=()
  for spec in $(section common) $(section "$tgt"); do
    if f="$(wheel_for "$spec")"; then files+=("$f"); else
      echo "MISSING wheel for $spec in $WHEELS"; status=1; fi
  done
  rm -rf "$dest"
  echo "== $tgt: installing ${#files[@]} wheels into $dest"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
    --target "$dest" "${files[@]}" 2>&1 | grep -v -i "warning: target directory" || true
  du -sh "$dest" | sed 's/^/   size /'
  for mod in sglang.srt.speculative.dspark_components.dspark_draft \
             sglang.srt.model_executor.runner.decode_cuda_graph_runner \
             sglang.srt.plugins.hook_registry sgl_kernel flashinfer.sampling; do
    if out="$(PYTHONPATH="$dest:$ROOT/python" "$PY" -c "import $mod" 2>&1)"; then
      echo "   OK   $tgt import $mod"
    else
      echo "   FAIL $tgt import $mod: $(echo "$out" | grep -E 'Error|error' | tail -1)"
      status=1
    fi
  done
  PYTHONPATH="$dest:$ROOT/python" "$PY" -c "
import importlib.metadata as md, torch
print('   versions:', 'sglang', md.version('sglang'), '| transformers', md.version('transformers'),
      '| tokenizers', md.version('tokenizers'), '| torch', torch.__version__,
      '| cuda', torch.cuda.is_available())
from sglang_dspark_dp.registry import instrument
for st in instrument(apply=True): print('   plugin:', st.line())
" 2>&1 | grep -E "versions|plugin:|Error" || status=1
done
exit $status
