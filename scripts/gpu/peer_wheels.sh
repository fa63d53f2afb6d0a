#!/usr/bin/env bash
# The CuTe-DSL peers (quack-kernels for the row ops, FlashAttention-4 for attention) for the H200 image (Python 3.12,
# torch 2.11+cu130, no registry there), packed into .peers/ (git-ignored) so that a device call can carry them. Run
# here, where pip reaches PyPI.
#
# Their CUDA 13 library wheel (nvidia-cutlass-dsl-libs-cu13) is 92 MB zipped, 237 MB unpacked, over the 64 MiB a
# device call carries, and xz (with the x86 filter) brings the whole set to about 68 MB only. So the unpacked
# site is split in two archives, each extracted into /tmp/site on the device by scripts/gpu/peers_env.sh:
#   .peers/peers-1.tar.xz   the CuTe DSL's MLIR library (one 193 MB .so)
#   .peers/peers-2.tar.xz   everything else (the DSL's Python, its runtime library, quack, flash-attn-4, their deps)
# Two calls back to back on the same (warm) machine: carry [".whl", ".peers/peers-1.tar.xz"], then the same with
# part 2 (with .whl's small wheels only: bitsandbytes' 43 MB, which only the QLoRA runs need, set aside for
# those calls). /tmp/site survives between calls only while the machine stays warm; if it was given back in
# between, the peers do not import and their rows say unavailable.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .peers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/w" \
  flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 \
  apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2 protobuf==7.36.2
mkdir "$tmp/site"
for w in "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
# the runtime stubs for other platforms (QNX, aarch64) are never loaded on the H200
rm -rf "$tmp"/site/nvidia_cutlass_dsl/cu13/lib/stubs
big=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so
[ -f "$tmp/site/$big" ] || { echo "missing $big (the wheel's layout changed)"; exit 1; }
xzc() { xz --x86 --lzma2=preset=9e -T2; }
tar -C "$tmp/site" -cf - "$big" | xzc > .peers/peers-1.tar.xz
tar -C "$tmp/site" --exclude="./$big" -cf - . | xzc > .peers/peers-2.tar.xz
ls -l .peers/peers-*.tar.xz
limit=$(( 64 * 1024 * 1024 ))
for f in .peers/peers-*.tar.xz; do
  [ "$(stat -c %s "$f")" -lt "$limit" ] || echo "WARNING: $f is over the 64 MiB a device call carries"
done
