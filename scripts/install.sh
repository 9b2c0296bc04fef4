#!/usr/bin/env bash
# Set up edgespec in ./.venv: the runtime, the export stage, the HTTP server, test tools (the openai
# client among them), and the small test model.
# torch is pinned to the CPU build first: an unpinned torch pulls several GB of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# TORCH_INDEX_URL: where pip finds that CPU build (e.g. https://download.pytorch.org/whl/cpu on a machine
# whose pip reaches PyPI itself, where a plain `torch==2.13.0` is the CUDA build); unset, pip's own index
.venv/bin/python -m pip install -q torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
.venv/bin/python -m pip install -q -e '.[export,serve,dev]'
# the oldest runtime dependencies pyproject.toml admits, apart (tests/test_min_deps.py runs the runtime on them)
rm -rf .venv/min-deps
.venv/bin/python -m pip install -q --no-deps --target .venv/min-deps -r scripts/min-deps.txt
.venv/bin/python scripts/fetch_models.py smollm2
# the one-call top-p (edgespec/native/topp.cpp) is built now rather than at the first sampled token;
# without a C++ compiler sampling stays in numpy
.venv/bin/python -c "from edgespec import native; native.top_p_kernel()"
