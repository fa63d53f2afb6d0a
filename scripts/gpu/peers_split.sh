#!/usr/bin/env bash
# Cut an archive into N byte parts of at most PART_MIB each, named <name>.<k>of<N> in DEST (scripts/gpu/peer_wheels.sh;
# scripts/gpu/peers_env.sh joins them on the device):
#   bash scripts/gpu/peers_split.sh ARCHIVE DEST [PART_MIB]
# Also takes several archives, joined in the order given, as one (for xz streams and tars, which extract joined with
# `tar -xJ --ignore-zeros`): e.g. the two fixed-split archives of before 2026-12-06,
#   bash scripts/gpu/peers_split.sh ".peers/peers-1.tar.xz .peers/peers-2.tar.xz" .peers
set -euo pipefail
src=${1:?ARCHIVE (or several, space-separated)}; dest=${2:?DEST folder}; mib=${3:-34}
[[ $mib =~ ^[1-9][0-9]*$ ]] || { echo "PART_MIB must be a positive whole number of MiB, got '$mib'" >&2; exit 2; }
# shellcheck disable=SC2086
total=$(cat $src | wc -c)
limit=$(( mib * 1024 * 1024 ))
n=$(( (total + limit - 1) / limit ))
[ "$n" -ge 1 ] || { echo "empty archive: $src" >&2; exit 2; }
size=$(( (total + n - 1) / n ))
mkdir -p "$dest"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2086
cat $src | split -b "$size" -d -a 3 - "$tmp/p"
k=0
for f in "$tmp"/p*; do
  k=$(( k + 1 ))
  mv "$f" "$dest/peers.tar.xz.${k}of${n}"
done
[ "$k" -eq "$n" ] || { echo "split made $k parts, expected $n" >&2; exit 1; }
echo "peers: $n part(s) of at most $(( size / 1024 / 1024 + 1 )) MiB in $dest"
