#!/usr/bin/env bash
# Sets up, builds and runs every test (ctest). GPU tests skip when no GPU is present.
#   scripts/test.sh                 the release build in build/
#   scripts/test.sh --sanitize      every CPU test under ASan + UBSan: a clang build in build-san/ (CUDA off)
#   scripts/test.sh --sanitize=ci   the subset CI runs (SANITIZE_CI: every module), in the same build with
#                                   only the test files that define it
# Arguments after -- go to ctest (e.g. -- -R Sampler).
set -euo pipefail
cd "$(dirname "$0")/.."

# The sanitizer subset CI runs (suite names, exact): every module (core, io, model, backend/cpu, quant,
# runtime, text, server, tools, cli: the lily binary through Cli, SpecCli, BadInput and Clients), leaving
# out the model-scale and long ones (QuantizeModel, StructuredOutput, Verify, Spec, LlamaCpp, the server's
# API and generator suites): they run under `--sanitize`. Sized for the CI budget on 2 cores.
SANITIZE_CI='^(Config|SafeTensors|BadInput|DenseBadInput|MtpBadInput|Layout|State|Step|MtpStep|ThreadPool|Sampler|Matmul|DeltaRule|Conv|Simd|Half|Affine|AffineInt8|Exl3Decode|QuantLoad|QuantKernels|SchedulerDevice|Loop|ReasoningBudget|DepthPlanner|Tokenizer|OutputParser|Utf8|Jinja|JinjaSemantics|Grammar|JsonGrammar|TokenGrammar|OutputGrammar|StructuredCache|Cli|SpecCli|SamplingCli|ChatFormat|StopFilter|ServerAuth|ServerQueue|ServerSpec|PromptCacheTest|Clients|Hostile|Gguf|GgufReader|GgufExport)\.'

mode=release
ctest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) mode=sanitize ;;
    --sanitize=ci) mode=sanitize-ci ;;
    --) shift; ctest_args+=("$@"); break ;;
    *) echo "usage: scripts/test.sh [--sanitize | --sanitize=ci] [-- CTEST_ARGS...]" >&2; exit 2 ;;
  esac
  shift
done

if [ "$mode" = release ]; then
  scripts/setup.sh build
  scripts/fetch-assets.sh
  cd build
  ctest --output-on-failure -j "$(nproc)" --timeout 900 "${ctest_args[@]}"
  exit
fi

# Sanitizer build: clang (it compiles this tree in about 70% of GCC's CPU time), -O1 -g1 (CMakeLists.txt). The CI
# subset builds only the test sources defining its tests (LILY_TEST_SUITES, tests/CMakeLists.txt).
suites=""
[ "$mode" = sanitize-ci ] && suites=$SANITIZE_CI
scripts/setup.sh build-san -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLILY_SANITIZE=ON -DLILY_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLILY_TEST_SUITES="$suites"
scripts/fetch-assets.sh
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
cd build-san
[ "$mode" = sanitize-ci ] && ctest_args=(-R "$SANITIZE_CI" "${ctest_args[@]}")
ctest --output-on-failure -j "$(nproc)" --timeout 1800 "${ctest_args[@]}"
