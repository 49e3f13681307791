# Sourced by the device scripts (on the GPU machine, from the repository root, with OUT set): unpacks the
# bundle of scripts/device/bundle.sh in $DEVBIN (default .devbin; D names it), points LD_LIBRARY_PATH at its
# libraries and LILY_GOLDEN_EXTRA at the tree's goldens, then the bundle's, then any given; makes $OUT and
# records the GPU in $OUT/gpu.txt. `device_need lily test_cuda` exits 2 naming a binary the bundle lacks.
D=${DEVBIN:-.devbin}
[ -f "$D/bundle.tgz" ] && tar -C "$D" -xzf "$D/bundle.tgz" && rm -f "$D/bundle.tgz"
# xz bundles: Python's lzma where the image has no xz binary
if [ -f "$D/bundle.tar.xz" ]; then
  if command -v xz > /dev/null; then tar -C "$D" -xJf "$D/bundle.tar.xz"
  else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$D/bundle.tar.xz" "$D"; fi &&
    rm -f "$D/bundle.tar.xz"
fi
export LD_LIBRARY_PATH="$PWD/$D/lib:${LD_LIBRARY_PATH:-}"
export LILY_GOLDEN_EXTRA="$PWD/tests/data/golden:$PWD/$D/golden${LILY_GOLDEN_EXTRA:+:$LILY_GOLDEN_EXTRA}"
mkdir -p "$OUT"
timeout 15 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt" 2>&1
device_need() {
  local b
  for b in "$@"; do
    [ -x "$D/$b" ] || { echo "error: no $D/$b (make the bundle with scripts/device/bundle.sh <cuda build dir> and carry $D)"; exit 2; }
  done
}
