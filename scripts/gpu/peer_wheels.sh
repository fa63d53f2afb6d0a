#!/usr/bin/env bash
# The CuTe-DSL peers (quack-kernels for the row ops, FlashAttention-4 for attention) for the H200 image (Python 3.12,
# torch 2.11+cu130, no registry there), packed into .peers/ (git-ignored) so that a device call can carry them. Run
# here, where pip reaches PyPI.
#
# Their CUDA 13 library wheel (nvidia-cutlass-dsl-libs-cu13) is 92 MB zipped, 237 MB unpacked, and xz (with the
# x86 filter) brings the whole site to about 68 MB: over what one device call carries (64 MiB, the working tree's
# own ~20 MiB included). So the one archive is cut, byte for byte, into parts of at most PART_MIB (default 34):
#   .peers/peers.tar.xz.1of2, .peers/peers.tar.xz.2of2
# each carried by one call, back to back on the same (warm) machine: carry [".whl", ".peers/peers.tar.xz.1of2"],
# then [".whl", ".peers/peers.tar.xz.2of2"] (.whl's small wheels only: bitsandbytes' 43 MB, which only the QLoRA
# runs need, set aside for those calls). scripts/gpu/peers_env.sh keeps each part in the site folder until the
# last arrives, then extracts the whole. /tmp/site survives between calls only while the machine stays warm; if it
# was given back in between, the peers do not import and their rows say unavailable.
# (A fixed split of the site, the MLIR library in one part and the rest in the other, left a 46 MB part that
# stopped fitting beside the tree once the tree passed 18 MiB; byte parts are all about the same size.)
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
rm -f .peers/peers-*.tar.xz .peers/peers.tar.xz.*
tar -C "$tmp/site" -cf - . | xz --x86 --lzma2=preset=9e -T2 > "$tmp/peers.tar.xz"
bash scripts/gpu/peers_split.sh "$tmp/peers.tar.xz" .peers "${PART_MIB:-34}"
ls -l .peers/
