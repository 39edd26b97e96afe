#!/usr/bin/env bash
# Stage the cp312 wheels the device needs for SGLang 0.5.16 and 0.5.17 (the
# DSpark draft module, decode_cuda_graph_runner, the plugin API and what this
# repo's benchmark imports), in batch folders small enough to carry.
#
#   scripts/device/stage_wheels.sh            # download, repack, split, lock
#
# Output: .stage/wheels/ (downloads, ignored), .whl1/ .whl2/ ... at the repo
# root (ignored via .git/info/exclude: /.whl*/), scripts/device/wheels.lock.
# See scripts/device/README.md for the chain of device calls.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STAGE="$ROOT/.stage/wheels"
LOCK="$ROOT/scripts/device/wheels.lock"
BATCH_MB="${BATCH_MB:-55}"
PY="${PYTHON:-python3}"
mkdir -p "$STAGE"

# Distributions missing from (or at the wrong version on) the device image,
# in the import closure of the modules above. Versions: the pins of the
# sglang wheels' Requires-Dist where they pin, else what those releases
# resolve to. "common" goes into both targets.
COMMON=(
  sglang-kernel==0.4.5          # repacked below (no FA3 flash_ops, no sm100)
  transformers==5.12.1          # device has 5.17 (sglang pins 5.12.1)
  tokenizers==0.22.2            # transformers 5.12.1 wants <=0.23.0
  apache-tvm-ffi==0.1.11
  xgrammar==0.2.1
  torchao==0.17.0
  torchcodec==0.11.1
  soundfile==0.13.1
  cffi==2.1.1
  compressed-tensors==0.20.1
  loguru==0.7.3
  gguf==0.19.0
  pydantic==2.14.4
  pydantic-core==2.50.5
  annotated-types==0.8.0
  typing-inspection==0.4.5
  fastapi==0.165.0
  starlette==1.10.0
  uvicorn==0.55.0
  openai==2.6.1
  distro==1.9.0
  sniffio==1.3.1
  msgspec==0.23.0
  orjson==3.13.0
  pyzmq==27.3.0
  setproctitle==1.3.8
  dill==0.4.1
  ipython==9.18.1
  traitlets==5.16.1
  wcwidth==0.9.4
  opentelemetry-api==1.45.2
  partial-json-parser==0.2.1.1.post7
  pybase64==1.5.1
  python-multipart==0.0.34
  watchfiles==1.3.0
  zstandard==0.25.0
  torch-memory-saver==0.0.10
)
SITE16=(sglang==0.5.16 flashinfer-python==0.6.14)
SITE17=(sglang==0.5.17 flashinfer-python==0.6.15.post1)
# Extra names can be appended without editing: EXTRA_COMMON="a==1 b==2".
read -r -a EXTRA <<< "${EXTRA_COMMON:-}"
COMMON+=("${EXTRA[@]}")

PLATFORMS=()
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done

fetch() {  # NAME==VERSION
  local spec="${1%%#*}" name ver norm
  name="${spec%%==*}"; ver="${spec##*==}"
  norm="$(echo "$name" | tr 'A-Z-.' 'a-z__')"
  if ls "$STAGE" | tr 'A-Z' 'a-z' | grep -q "^${norm}-${ver}-"; then return 0; fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]}" -d "$STAGE" "$spec"
}

for spec in "${COMMON[@]}" "${SITE16[@]}" "${SITE17[@]}"; do
  echo "fetch $spec"; fetch "$spec"
done

# Repack sglang-kernel: drop the FA3 kernels (only sgl_kernel.flash_attn
# loads flash_ops.abi3.so) and the sm100 ops (the H200 is sm90), and their
# RECORD lines.
KW="$(ls "$STAGE"/sglang_kernel-0.4.5-*.whl | head -1)"
"$PY" - "$KW" <<'PYEOF'
import os, sys, tempfile, zipfile
src = sys.argv[1]
def dropped(name):
    return name == "sgl_kernel/flash_ops.abi3.so" or name.startswith("sgl_kernel/sm100/")
with zipfile.ZipFile(src) as z:
    names = z.namelist()
    if not any(dropped(n) for n in names):
        sys.exit(0)
    print(f"repack {os.path.basename(src)}: {os.path.getsize(src)/1e6:.1f} MB")
    fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(src))
    os.close(fd)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            if dropped(info.filename):
                continue
            data = z.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(l for l in lines if not dropped(l.split(",")[0])).encode()
            out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
os.replace(tmp, src)
print(f"  -> {os.path.getsize(src)/1e6:.1f} MB")
PYEOF

# Lock file: the wheel of each entry, per target.
norm() { echo "$1" | tr 'A-Z-.' 'a-z__'; }
{
  echo "# Wheels staged for the device by scripts/device/stage_wheels.sh (cp312,"
  echo "# manylinux x86_64). Installed with --no-index --no-deps by install_on_device.sh."
  echo "[common]"; for s in "${COMMON[@]}"; do echo "${s%%#*}" | tr -d ' '; done
  echo "[site16]"; for s in "${SITE16[@]}"; do echo "$s"; done
  echo "[site17]"; for s in "${SITE17[@]}"; do echo "$s"; done
} > "$LOCK"

# Split into batches (first-fit decreasing, < BATCH_MB each).
rm -rf "$ROOT"/.whl[0-9]*
"$PY" - "$STAGE" "$ROOT" "$BATCH_MB" <<'PYEOF'
import os, shutil, sys
stage, root, limit = sys.argv[1], sys.argv[2], float(sys.argv[3]) * 1e6
files = sorted(((os.path.getsize(os.path.join(stage, f)), f)
                for f in os.listdir(stage) if f.endswith(".whl")), reverse=True)
bins = []
for size, f in files:
    if size > limit:
        sys.exit(f"{f} is {size/1e6:.1f} MB, over the batch limit")
    for b in bins:
        if b[0] + size <= limit:
            b[0] += size; b[1].append(f); break
    else:
        bins.append([size, [f]])
for i, (size, fs) in enumerate(bins, 1):
    d = os.path.join(root, f".whl{i}")
    os.makedirs(d)
    for f in fs:
        shutil.copy2(os.path.join(stage, f), d)
    print(f".whl{i}: {len(fs):3d} wheels, {size/1e6:6.1f} MB ({size/2**20:.1f} MiB)")
print(f"total: {sum(b[0] for b in bins)/1e6:.1f} MB in {len(bins)} batches")
PYEOF
