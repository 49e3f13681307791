#!/usr/bin/env bash
# Sets up and builds lily, then serves the built-in demo model (random weights: its answers are random
# text) on http://127.0.0.1:8080 (chat page at /, OpenAI API at /v1). Extra arguments go to `lily serve`,
# e.g. scripts/run.sh --model /path/to/checkpoint --port 9000.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
scripts/fetch-assets.sh
exec build/lily serve "$@"
