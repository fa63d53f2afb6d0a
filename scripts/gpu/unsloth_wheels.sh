#!/usr/bin/env bash
# Wheels that let `lora_e2e.py --setups unsloth` run on the H200 image (Python 3.12, torch 2.11, transformers 5.17,
# peft 0.21, no registry there), written to .whl/ (git-ignored; name it in the device call's carry). Run here,
# where pip reaches PyPI. Unsloth 2026.10.9's wheel is 28.6 MB, 26 MB of it `studio/` (a web app `import unsloth`
# never touches): it is repacked without it, so that with bitsandbytes (43 MB, which Unsloth's loader needs even
# for a 16-bit base) everything fits the 64 MiB working-tree limit of a device call (about 53 MB in all).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$1" "${@:2}"; }
get "$tmp" unsloth==2026.10.9
get .whl unsloth_zoo==2026.10.9 "trl==1.15.0" "datasets==4.8.5" dill==0.4.1 multiprocess==0.70.19 tyro==1.0.17 \
  docstring_parser==0.18.0 typeguard==4.6.1 shtab==1.13.0 msgspec==0.23.0 cut_cross_entropy==25.1.1 \
  bitsandbytes==0.50.2 liger-kernel==0.8.5 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 \
  typing_inspection==0.4.5  # pydantic: as in the run that worked (the image has none)
# the same wheel without studio/ (and its RECORD lines)
mkdir "$tmp/x" && (cd "$tmp/x" && python3 -m zipfile -e "$tmp"/unsloth-2026.10.9-py3-none-any.whl . \
  && rm -rf studio && grep -v '^studio/' unsloth-2026.10.9.dist-info/RECORD > R && mv R unsloth-2026.10.9.dist-info/RECORD \
  && python3 -m zipfile -c "$OLDPWD/.whl/unsloth-2026.10.9-py3-none-any.whl" ./*)
du -ch .whl/*.whl | tail -n 1
