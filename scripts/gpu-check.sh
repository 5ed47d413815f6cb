#!/usr/bin/env bash
# Checks the CUDA backend on a GPU node: builds and runs the CUDA tests, then the GPU benchmark,
# and prints their figures. Run from anywhere in the repository: scripts/gpu-check.sh
#
# Needs the NVIDIA driver (libcuda.so.1) and NVRTC (libnvrtc.so.13 or .12) on the library path;
# without them every test prints "skipped: cuda unavailable: <why>" and the benchmark says why.
set -euo pipefail
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
cargo xtask bench gpu
