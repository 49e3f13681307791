#!/usr/bin/env bash
# Sets up and builds lily, then runs the main job on the bundled golden model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/lily info --model tests/data/golden/qwen3_5_moe_text-a
