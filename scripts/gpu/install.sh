#!/usr/bin/env bash
# On the GPU machine, after the batches of `scripts/gpu/pack.py pack` have been stashed in
# STAGE/parts: join and check the wheels, install them and edgespec into STAGE/site with
# `pip install --target` (nothing of the machine's own Python is touched), and write STAGE/env.sh,
# which puts STAGE/site first on PYTHONPATH (its onnxruntime-gpu shadows the machine's CPU
# onnxruntime) and the CUDA libraries of the machine's `nvidia/*` wheels on LD_LIBRARY_PATH.
#
#   bash scripts/gpu/install.sh /tmp/edgespec-gpu && source /tmp/edgespec-gpu/env.sh
#
# An --xz pack's archives (builder.tar.xz, ortgpu.tar.xz: pack.py) are unpacked into the site as pip lays wheels
# out, their files/ (the tokenizer) into STAGE/files.
#
# WHEELS (file patterns, default every wheel and wheel archive of the pack) picks the wheels, SITE (default STAGE/site)
# and ENV_SH (default STAGE/env.sh) where they go: the builder's site, as soon as the first batch is
# there, is  WHEELS='onnxruntime-[0-9]*.whl onnxruntime_genai*.whl gguf*.whl' SITE=STAGE/site-build
# ENV_SH=STAGE/env-build.sh  (CPU onnxruntime 1.31, which genai 0.18 needs). A CPU onnxruntime is
# left out where onnxruntime-gpu is picked too (both are the package onnxruntime).
#
# Runs offline (--no-index) and on a CPU machine too (the tests do: onnxruntime-gpu installs there,
# it just finds no GPU). PYTHON picks the interpreter (default python3).
set -euo pipefail
STAGE=$(realpath -m "${1:-/tmp/edgespec-gpu}")
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# the wheels of this pack (not whatever an earlier pack left in STAGE/files)
SITE=$(realpath -m "${SITE:-$STAGE/site}")
ENV_SH=$(realpath -m "${ENV_SH:-$STAGE/env.sh}")
read -r -a PATTERNS <<< "${WHEELS:-*.whl *.whl.tar.xz builder.tar.xz ortgpu.tar.xz}"
JOINED=$("$PY" "$ROOT/scripts/gpu/pack.py" join --stage "$STAGE/parts" --out "$STAGE/files" --only "${PATTERNS[@]}")
mapfile -t ALL <<< "$JOINED"
PICKED=()
ARCHIVES=()
GPU_ORT=0
for w in "${ALL[@]}"; do
  case "$(basename "$w")" in onnxruntime_gpu-*|ortgpu.tar.xz) GPU_ORT=1 ;; esac
done
for w in "${ALL[@]}"; do
  b=$(basename "$w")
  [ -n "$w" ] || continue
  case "$b" in *.tar.xz) ARCHIVES+=("$w"); continue ;; *.whl) ;; *) continue ;; esac
  if [ "$GPU_ORT" = 1 ] && [[ "$b" == onnxruntime-[0-9]* ]]; then continue; fi
  PICKED+=("$w")
done
[ $(( ${#PICKED[@]} + ${#ARCHIVES[@]} )) -gt 0 ] || { echo "error: no wheel matches ${PATTERNS[*]}" >&2; exit 2; }
mkdir -p "$SITE"
if [ "${#PICKED[@]}" -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "${PICKED[@]}"
fi
for a in "${ARCHIVES[@]}"; do
  "$PY" "$ROOT/scripts/gpu/pack.py" unpack "$a" --site "$SITE" --files "$STAGE/files"
done
# edgespec itself, from this checkout (no build isolation: setuptools is already there, no index)
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
    --target "$SITE" "$ROOT"
# the CUDA 13 / cuDNN 9 libraries of the machine's own nvidia-* wheels (torch's), and the driver's
LIBS=$("$PY" - <<'PYEOF'
import glob, os, site, sys
roots = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
dirs = []
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "**", "lib"), recursive=True)):
        if glob.glob(os.path.join(d, "*.so*")) and d not in dirs:
            dirs.append(d)
for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/local/cuda/lib64"):
    if os.path.isdir(d) and d not in dirs:
        dirs.append(d)
print(":".join(dirs))
PYEOF
)
{
  printf 'export PYTHONPATH=%q"${PYTHONPATH:+:$PYTHONPATH}"\n' "$SITE"
  printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$LIBS"
  printf 'export PATH=%q":$PATH"\n' "$SITE/bin"
} > "$ENV_SH"
# shellcheck disable=SC1091
source "$ENV_SH"
"$PY" -c "import onnxruntime as o, edgespec; print('onnxruntime', o.__version__, o.get_available_providers(), 'edgespec from', edgespec.__file__)"
echo "library dirs: ${LIBS:-none found}"
