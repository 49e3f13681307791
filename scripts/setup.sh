#!/usr/bin/env bash
# Installs what lily needs to build and test on Debian 12 (idempotent), then configures and builds.
# Usage: scripts/setup.sh [build-dir [CMAKE_ARGS...]]   (default: build; CMake arguments also in $LILY_CMAKE_ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true

PKGS=(build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libcli11-dev libfmt-dev libpcre2-dev libutf8proc-dev
      libcpp-httplib-dev libssl-dev zlib1g-dev libbrotli-dev libreadline-dev
      libgtest-dev libgmock-dev libbenchmark-dev chromium python3
      clang libclang-rt-14-dev lld)
missing=()
for p in "${PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# Node.js/npm (test assets from the npm registry): Debian's packages only when none is on PATH.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# nvcc is optional; the CUDA toolkit lives outside apt on our machines.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# LILY_UNITY=1 (CI's from-scratch builds): unity build of the C++ targets (CMakeLists.txt, LILY_UNITY).
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DLILY_UNITY="$([ "${LILY_UNITY:-0}" = 1 ] && echo ON || echo OFF)" \
  ${LILY_CMAKE_ARGS:-} "$@"
cmake --build "$BUILD" -j "$(nproc)"
