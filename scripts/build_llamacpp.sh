#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-perplexity from a pinned source release for the side-by-side
# benchmarks (scripts/bench_spec.py --llamacpp) and perplexities (docs/bench/perplexity_s34.md). The source is the copy of llama.cpp vendored in the
# llama-cpp-python sdist on PyPI, checked against its sha256. Not part of CI or the install:
# it takes ~10 minutes on 2 cores. Output: .llamacpp/bin/llama-server, .llamacpp/bin/llama-perplexity.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
OUT=.llamacpp
mkdir -p "$OUT/src"
SDIST="$OUT/src/llama_cpp_python-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$OUT/src"
fi
echo "$SHA256  $SDIST" | sha256sum -c - >/dev/null || { echo "sha256 mismatch for $SDIST" >&2; exit 1; }
SRC="$OUT/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -d "$SRC" ] || tar xzf "$SDIST" -C "$OUT/src"
# Without AMX: on an AMX CPU (Sapphire Rapids and later Xeons) this release's AMX backend segfaults in
# ggml_backend_amx_mul_mat on the first Q4_K_M product (ggml-org/llama.cpp#20824, seen on session 11's Xeon);
# -march=native would turn it on, so the AMX instruction sets are taken back out. llama.cpp then runs its
# AVX-512 (VNNI) kernels with weight repacking, its fastest working configuration there.
NOAMX=""
if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
cmake -S "$SRC" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DCMAKE_C_FLAGS="$NOAMX" -DCMAKE_CXX_FLAGS="$NOAMX" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$OUT/build" --target llama-server llama-perplexity -j "$(nproc)"
mkdir -p "$OUT/bin"
cp "$OUT/build/bin/llama-server" "$OUT/build/bin/llama-perplexity" "$OUT/bin/"
"$OUT/bin/llama-server" --version 2>&1 | head -2
