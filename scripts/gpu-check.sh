#!/usr/bin/env bash
# Checks the CUDA backend on a GPU node: builds and runs the CUDA tests, then the GPU benchmark,
# and prints their figures. Run from anywhere in the repository: scripts/gpu-check.sh
#
# Needs the NVIDIA driver (libcuda.so.1) and NVRTC (libnvrtc.so.13 or .12) on the library path.
# The NVRTC major version must not be newer than the driver's CUDA version (NVRTC 13 writes PTX
# that only a CUDA 13 driver loads). RINGSIDE_REQUIRE_CUDA makes a test fail, not skip, where the
# device cannot be used.
set -euo pipefail
export RINGSIDE_REQUIRE_CUDA=1
cd "$(dirname "$0")/.."

echo "== device"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi not found"
fi

echo "== CUDA tests (one at a time, so each has the device to itself)"
cargo test -p ringside-kernels --test cuda -- --nocapture --test-threads=1

echo "== CUDA unit tests (NVRTC compile, launch without a ring kernel left behind)"
cargo test -p ringside-kernels --lib cuda -- --nocapture --test-threads=1

echo "== the daemon's CUDA canary"
cargo test -p ringside-daemon cuda_asked_for -- --nocapture

echo "== GPU benchmark"
out=$(mktemp)
cargo xtask bench gpu | tee "$out"
if grep -q "^skipped" "$out"; then
    echo "gpu-check: the benchmark did not run on a GPU" >&2
    exit 1
fi
