#!/usr/bin/env bash
# The main job on an embedded default: builds Tandem, creates the default model if it is absent
# (a random-initialised tiny Llama, until trained models ship), and generates text in-process.
#   scripts/demo.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${TANDEM_BUILD_DIR:-build}"
MODEL="${TANDEM_DEFAULT_MODEL:-models-cache/tiny-llama}"
PROMPT="${1:-Once upon a time}"

bash scripts/install_deps.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target tandem
if [[ ! -f "$MODEL/config.json" ]]; then
  "$BUILD_DIR/cli/tandem" make-model --preset tiny-llama --out "$MODEL" --seed 0
fi
"$BUILD_DIR/cli/tandem" generate --model "$MODEL" --prompt "$PROMPT" --max-tokens 48 --seed 0
