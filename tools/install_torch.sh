#!/usr/bin/env bash
# The torch build for this machine, into the venv whose pip is $1 (--print: say the command, run nothing):
#   TORCH_INDEX_URL set     that index (any build you choose)
#   ROCm ($ROCM_PATH, default /opt/rocm, holds .info/version)
#                           PyTorch's ROCm index for that ROCm version (set TORCH_INDEX_URL if it has no wheel)
#   nvidia-smi on the PATH  the package index's default torch (a CUDA build)
#   anything else           the CPU build (PyTorch's CPU index, besides the package index)
# A venv made with the system's site packages (the Makefile's USE_SYSTEM_TORCH=1, or a torch already importable
# by python3) keeps that torch: nothing is installed.
set -euo pipefail
pip="$1"
mode="${2:-}"
version="${TORCH_VERSION:-2.13.0}"
rocm="${ROCM_PATH:-/opt/rocm}"

if [ "${KEEP_TORCH:-0}" = 1 ]; then
    echo "# keeping the environment's torch"
    exit 0
fi
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    cmd=("$pip" install -q "torch==$version" --index-url "$TORCH_INDEX_URL")
elif [ -f "$rocm/.info/version" ]; then
    rocm_version=$(cut -d. -f1,2 < "$rocm/.info/version")
    cmd=("$pip" install -q "torch==$version" --index-url "https://download.pytorch.org/whl/rocm$rocm_version")
elif command -v nvidia-smi > /dev/null 2>&1; then
    cmd=("$pip" install -q "torch==$version")
else
    cmd=("$pip" install -q "torch==$version" "triton==3.7.1" --extra-index-url https://download.pytorch.org/whl/cpu)
fi
if [ "$mode" = --print ]; then
    echo "${cmd[@]}"
else
    "${cmd[@]}"
fi
