#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest). GPU tests skip when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
scripts/fetch-assets.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900
