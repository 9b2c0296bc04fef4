#!/usr/bin/env bash
# On the GPU machine, after the batches of `scripts/gpu/pack.py pack` have been stashed in
# STAGE/parts: join and check the wheels, install them and edgespec into STAGE/site with
# `pip install --target` (nothing of the machine's own Python is touched), and write STAGE/env.sh,
# which puts STAGE/site first on PYTHONPATH (its onnxruntime-gpu shadows the machine's CPU
# onnxruntime) and the CUDA libraries of the machine's `nvidia/*` wheels on LD_LIBRARY_PATH.
#
#   bash scripts/gpu/install.sh /tmp/edgespec-gpu && source /tmp/edgespec-gpu/env.sh
#
# Runs offline (--no-index) and on a CPU machine too (the tests do: onnxruntime-gpu installs there,
# it just finds no GPU). PYTHON picks the interpreter (default python3).
set -euo pipefail
STAGE=$(realpath -m "${1:-/tmp/edgespec-gpu}")
PY=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# the wheels of this pack (not whatever an earlier pack left in STAGE/files)
JOINED=$("$PY" "$ROOT/scripts/gpu/pack.py" join --stage "$STAGE/parts" --out "$STAGE/files" --only '*.whl')
mapfile -t WHEELS <<< "$JOINED"
mkdir -p "$STAGE/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STAGE/site" \
    "${WHEELS[@]}"
# edgespec itself, from this checkout (no build isolation: setuptools is already there, no index)
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade \
    --target "$STAGE/site" "$ROOT"
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
  printf 'export PYTHONPATH=%q"${PYTHONPATH:+:$PYTHONPATH}"\n' "$STAGE/site"
  printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$LIBS"
  printf 'export PATH=%q":$PATH"\n' "$STAGE/site/bin"
} > "$STAGE/env.sh"
# shellcheck disable=SC1091
source "$STAGE/env.sh"
"$PY" -c "import onnxruntime as o, edgespec; print('onnxruntime', o.__version__, o.get_available_providers(), 'edgespec from', edgespec.__file__)"
echo "library dirs: ${LIBS:-none found}"
