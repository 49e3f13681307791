#!/usr/bin/env bash
# Issue 20's H200 rows: the dense Qwen3.5-0.8B and -4B synth shapes in affine 4-bit and bf16, prefill of a
# 4K prompt and decode at 4K context (512 / 256 beside them), with the roofline fraction and the prompt
# FLOP rate, and the kernels of one decode step (bench-all.sh). Output under $OUT (/tmp/lily-bench).
export PRESETS=${PRESETS:-"qwen3.5-0.8b qwen3.5-4b"} FORMATS=${FORMATS:-"affine4 bf16"} PREFILL=${PREFILL:-512,4096}
export CTX=${CTX:-256,4096} REPEATS=${REPEATS:-3} INSPECT_FORMATS=${INSPECT_FORMATS:-"affine4 bf16"}
exec "$(dirname "$0")/bench-all.sh"
