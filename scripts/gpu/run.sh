#!/usr/bin/env bash
# The GPU run (issue #13), on the GPU machine after install.sh (and export_shaped.sh started in the
# background): SmolLM2's bundles, the CUDA and layout tests, then scripts/gpu/bench.py once the
# shaped bundles are there. Everything it keeps goes to OUT (default STAGE/out):
#   pytest.log, bench.log, gpu-run.json, shaped.log, exports.log, nvidia-smi.txt
#   STAGE=/tmp/edgespec-gpu OUT=/tmp/out bash scripts/gpu/run.sh
# RUN_BUDGET (seconds, default 480) bounds the whole script: each step's timeout is its own or what is left of
# the budget less what the steps after it keep (the bench BENCH_KEEP s, default 180, and 20 s), whichever is less
# (a device call ends at 600 s; a step that hung spent the window before).
# SECTIONS (default all) picks the bench's sections; PYTEST=0 skips the tests; SHAPED_WAIT is how
# long to wait for the background exports (seconds, default 360); SMOL_EXPORT=0 skips SmolLM2 (skipped by itself
# where the pack has none),
# SMOL_CPU=0 its cpu-layout bundle (only the smol section compares with it: ~65 s of a short window);
# PYTEST_FILES picks the test files; PROVIDER=cpu runs the bench on the
# CPU EP (a dry run on a machine without a GPU).
set -uo pipefail
STAGE=$(realpath -m "${STAGE:-/tmp/edgespec-gpu}")
OUT=${OUT:-$STAGE/out}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# shellcheck disable=SC1091
source "$STAGE/env.sh"
export PYTHONUNBUFFERED=1 EDGESPEC_MODELS="$STAGE/files" EDGESPEC_BUNDLES="$STAGE/bundles"
mkdir -p "$OUT" "$STAGE/bundles"
B=$STAGE/bundles
say() { echo "[$(date +%T)] $*"; }
DEADLINE=$((SECONDS + ${RUN_BUDGET:-480}))
# left S [KEEP]: the seconds a step may take, at most S and what the budget leaves less KEEP (default: the bench's
# BENCH_KEEP) and 20 s (>= 1); the bench itself keeps 0
left() {
  local keep=${2:-${BENCH_KEEP:-180}} l
  l=$((DEADLINE - SECONDS - keep - 20)); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"
}
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
SMOL=$STAGE/files/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${SMOL_EXPORT:-1}" = 1 ] && ! grep -q 'SmolLM2' "$STAGE/parts/MANIFEST.json" 2>/dev/null; then
  say "no SmolLM2 in the pack: its bundles skipped"
  SMOL_EXPORT=0
fi
if [ "${SMOL_EXPORT:-1}" = 1 ]; then
  python3 scripts/gpu/pack.py join --stage "$STAGE/parts" --out "$STAGE/files" --only 'SmolLM2*' || exit 3
  if [ ! -f "$SMOL" ] && [ -f "$SMOL.tar.xz" ]; then  # (an --xz pack's)
    python3 scripts/gpu/pack.py unpack "$SMOL.tar.xz" --site "$STAGE/site" --files "$STAGE/files" || exit 3
  fi
fi
if [ "${SMOL_EXPORT:-1}" = 1 ] && [ "${SMOL_CPU:-1}" = 1 ] && [ ! -f "$B/smollm2-int4/edgespec.json" ]; then
  say "SmolLM2 int4, cpu layout"
  timeout "$(left 240)" edgespec export "$SMOL" -o "$B/smollm2-int4" --target-precision int4 --max-context 2048 \
      --no-quality --force >>"$OUT/exports.log" 2>&1 || say "FAILED: SmolLM2 cpu-layout export (exports.log)"
fi
if [ "${SMOL_EXPORT:-1}" = 1 ] && [ ! -f "$B/smollm2-int4-cuda/edgespec.json" ]; then
  say "SmolLM2 int4, cuda layout (with its quality report)"
  timeout "$(left 300)" edgespec export "$SMOL" -o "$B/smollm2-int4-cuda" --target-precision int4 --max-context 2048 \
      --device cuda --force >>"$OUT/exports.log" 2>&1 || say "FAILED: SmolLM2 cuda-layout export (exports.log)"
fi
if [ "${PYTEST:-1}" = 1 ]; then
  say "pytest ${PYTEST_FILES:=tests/test_cuda.py tests/test_layout.py}"
  # shellcheck disable=SC2086
  timeout "$(left "${PYTEST_TIMEOUT:-300}")" python3 -m pytest -q -rs -p no:cacheprovider $PYTEST_FILES \
      >"$OUT/pytest.log" 2>&1
  rc_pytest=$?
  say "pytest rc=$rc_pytest :: $(tail -1 "$OUT/pytest.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | cut -c1-300
fi
say "waiting for the shaped exports"
for _ in $(seq "$(left "${SHAPED_WAIT:-360}")"); do
  [ -f "$STAGE/shaped.done" ] && break
  # no export running (never started, or died): waiting longer gains nothing
  { [ -f "$STAGE/shaped.pid" ] && kill -0 "$(cat "$STAGE/shaped.pid")" 2>/dev/null; } || break
  sleep 1
done
cp "$STAGE/shaped.log" "$OUT/shaped.log" 2>/dev/null
say "shaped: $(cat "$STAGE/shaped.done" 2>/dev/null || echo 'not done'); $(cat "$STAGE/shaped.cuda.done" 2>/dev/null)"
# nothing beside the timings: the background export's process group, by its pid file (a pkill -f by
# name also matched the calling shell's own command line and killed this run on the GPU machine)
if [ -f "$STAGE/shaped.pid" ] && ! [ -f "$STAGE/shaped.done" ]; then
  kill -- "-$(cat "$STAGE/shaped.pid")" 2>/dev/null
fi
SHAPED=$B/qwen-shaped-cuda; DCPU=$B/qwen0.5b-shaped-cpu
args=(--provider "${PROVIDER:-cuda}" --json "$OUT/gpu-run.json" --sections "${SECTIONS:-env,shaped,probe_overlap,smol,exactness,smol_bench,memory,placement}")
[ -f "$SHAPED/edgespec.json" ] && args+=(--shaped "$SHAPED")
[ -f "$DCPU/edgespec.json" ] && args+=(--drafter-cpu "$DCPU")
[ -f "$B/qwen0.5b-shaped-cuda/edgespec.json" ] && args+=(--drafter-cuda "$B/qwen0.5b-shaped-cuda")
[ -f "$B/smollm2-int4-cuda/edgespec.json" ] && args+=(--smol-cuda "$B/smollm2-int4-cuda")
[ -f "$B/smollm2-int4/edgespec.json" ] && args+=(--smol-cpu "$B/smollm2-int4")
say "bench ${args[*]}"
timeout "$(left "${BENCH_TIMEOUT:-300}" 0)" python3 scripts/gpu/bench.py "${args[@]}" >"$OUT/bench.log" 2>&1
rc_bench=$?
say "bench rc=$rc_bench"
grep -E "^   [a-z_]+: " "$OUT/bench.log" | cut -c1-400
exit $(( ${rc_pytest:-0} != 0 || rc_bench != 0 ))
