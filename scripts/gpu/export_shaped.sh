#!/usr/bin/env bash
# On the GPU machine (after install.sh), in the background while the last batch travels: build the
# Qwen2.5-Coder-1.5B/0.5B-shaped random models (make_shaped.py) and export them
#   STAGE/bundles/qwen-shaped-cuda    target and drafter INT4, cuda layout (as the 8 GB plans)
#   STAGE/bundles/qwen0.5b-shaped-cpu the 0.5B alone in the cpu layout (a drafter placed on the CPU)
# SHAPED_DRAFTER_ONLY=1 exports only the 0.5B, alone, as STAGE/bundles/qwen0.5b-shaped-cuda (a short window).
# ENV_SH picks the environment file (default STAGE/env.sh). SHAPED_CPU_DRAFTER=0 skips the cpu-layout 0.5B. SHAPED_LAYERS=N builds N-layer models instead (a dry run on a CPU machine, not for timing).
# Writes STAGE/shaped.log, then STAGE/shaped.done (rc of each step) when it ends.
#   setsid nohup bash scripts/gpu/export_shaped.sh /tmp/edgespec-gpu >/dev/null 2>&1 &
set -uo pipefail
STAGE=$(realpath -m "${1:-/tmp/edgespec-gpu}")
ENV_SH=$(realpath -m "${ENV_SH:-$STAGE/env.sh}")  # before the cd below: a relative path is the caller's
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
source "$ENV_SH"  # ENV_SH: the builder's site (install.sh), if the export starts before the GPU wheel is there
export PYTHONUNBUFFERED=1
rm -f "$STAGE/shaped.done" "$STAGE/shaped.cuda.done" "$STAGE/shaped.pid"
echo $$ > "$STAGE/shaped.pid"  # started with setsid: its process group, which run.sh stops if it must
exec >"$STAGE/shaped.log" 2>&1
t0=$(date +%s)
stop() { echo "$1" | tee "$STAGE/shaped.cuda.done" > "$STAGE/shaped.done"; exit 1; }
# (an --xz pack's tokenizer came with builder.tar.xz, which install.sh unpacked into STAGE/files)
[ -f "$STAGE/files/qwen-tokenizer/tokenizer.json" ] || \
    python3 scripts/gpu/pack.py join --stage "$STAGE/parts" --out "$STAGE/files" --only 'qwen-tokenizer/*' \
    || stop "tokenizer=missing"
python3 scripts/gpu/make_shaped.py --tokenizer "$STAGE/files/qwen-tokenizer" -o "$STAGE/hf-shaped" ${SHAPED_LAYERS:+--layers "$SHAPED_LAYERS"}
rc_make=$?
[ "$rc_make" = 0 ] || stop "make=$rc_make"
if [ "${SHAPED_DRAFTER_ONLY:-0}" = 1 ]; then  # the 0.5B alone, a cuda-layout target (its argmax output too)
  edgespec export "$STAGE/hf-shaped/qwen0.5b" -o "$STAGE/bundles/qwen0.5b-shaped-cuda" --target-precision int4 \
      --device cuda --block-size 128 --max-context 4096 --no-quality --force
  rc=$?
  echo "0.5B cuda-layout export done after $(( $(date +%s) - t0 )) s"
  echo "make=$rc_make cuda0.5b=$rc" | tee "$STAGE/shaped.cuda.done" > "$STAGE/shaped.done"
  exit "$rc"
fi
edgespec export "$STAGE/hf-shaped/qwen1.5b" --drafter "$STAGE/hf-shaped/qwen0.5b" -o "$STAGE/bundles/qwen-shaped-cuda" \
    --target-precision int4 --drafter-precision int4 --device cuda --block-size 128 --drafter-block-size 128 \
    --drafter-vocab 65536 --max-context 4096 --no-quality --force
rc_cuda=$?
echo "cuda-layout export done after $(( $(date +%s) - t0 )) s"
echo "make=$rc_make cuda=$rc_cuda" > "$STAGE/shaped.cuda.done"
rc_cpu=skipped
if [ "${SHAPED_CPU_DRAFTER:-1}" = 1 ]; then
  edgespec export "$STAGE/hf-shaped/qwen0.5b" -o "$STAGE/bundles/qwen0.5b-shaped-cpu" --target-precision int4 \
      --block-size 128 --max-context 4096 --no-quality --force
  rc_cpu=$?
fi
echo "all done after $(( $(date +%s) - t0 )) s"
echo "make=$rc_make cuda=$rc_cuda cpu=$rc_cpu" > "$STAGE/shaped.done"
