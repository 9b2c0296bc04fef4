#!/usr/bin/env bash
# The main job on the embedded default: install, fetch SmolLM2-135M, export it to INT4, generate a reply.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
MODELS=${EDGESPEC_MODELS:-$HOME/.cache/edgespec/models}
if [ ! -f bundles/smollm2-int4/edgespec.json ]; then
  .venv/bin/edgespec export "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" --target-precision int4 \
      --max-context 2048 -o bundles/smollm2-int4
fi
.venv/bin/edgespec generate bundles/smollm2-int4 --chat -p "Write one sentence about the sea." --max-new-tokens 48
