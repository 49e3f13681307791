#!/usr/bin/env bash
# Packs libFuzzer targets built by scripts/fuzz.sh (build-fuzz/) for a long run on the GPU machine's CPU
# cores (scripts/device/fuzz-fork.sh): each fuzz_TARGET binary, the shared libraries it needs beyond glibc
# (the device image lacks fmt, PCRE2, utf8proc) and the corpus earlier runs kept in build-fuzz/corpus/TARGET.
# Usage: scripts/device/fuzz-bundle.sh TARGET...   then pass carry: [".devfuzz"] to the device call.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -gt 0 ] || { echo "usage: $0 TARGET..." >&2; exit 2; }
D=.devfuzz
EX=$(git rev-parse --git-path info/exclude); grep -qx "/$D/" "$EX" 2>/dev/null || echo "/$D/" >> "$EX"
S=$(mktemp -d)
mkdir -p "$S/lib" "$S/corpus"
for t in "$@"; do
  bin=build-fuzz/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz-bundle: $bin missing; build it with scripts/fuzz.sh 0 $t" >&2; exit 2; }
  cp "$bin" "$S/"
  for lib in $(ldd "$bin" | awk '/=>/ {print $3}'); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
      *) cp -L "$lib" "$S/lib/" ;;
    esac
  done
  mkdir -p "$S/corpus/$t"
  [ -d "build-fuzz/corpus/$t" ] && cp -r "build-fuzz/corpus/$t/." "$S/corpus/$t/"
done
rm -rf "$D" && mkdir -p "$D"
tar -C "$S" -czf "$D/bundle.tgz" . && rm -rf "$S"
du -sh "$D"
