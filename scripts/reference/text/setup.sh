#!/usr/bin/env bash
# Installs the reference implementations used to produce tests/data/text/*.json into .cache/ref
# (not committed), plus the real Qwen3 tokenizer (scripts/fetch-assets.sh). Then run:
#   node scripts/reference/text/tokenizer_cases.mjs
#   node scripts/reference/text/template_cases.mjs
set -euo pipefail
cd "$(dirname "$0")/../../.."
scripts/fetch-assets.sh
mkdir -p .cache/ref
cd .cache/ref
[ -f package.json ] || echo '{"private":true}' > package.json
npm install --no-audit --no-fund --silent @huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.11
