# Source on the device (bash), from the repo root, after carrying .peers/peers-*.tar.xz (scripts/gpu/peer_wheels.sh):
#   . scripts/gpu/peers_env.sh
# Extracts each part found into /tmp/site, or $HEARTH_SITE when set (once: a marker file per part, so a second call
# on the same warm machine adds only the part it carried), leaves out the packages the image already imports (the image's copies stay in
# charge: a PYTHONPATH entry would shadow them), and puts /tmp/site and the CuTe DSL's package folder (normally
# added by a .pth file, which extracting does not run) on PYTHONPATH. Prints whether quack and flash_attn.cute import.
_peers_site=${HEARTH_SITE:-/tmp/site}  # the site folder (HEARTH_SITE: elsewhere, e.g. a test's)
mkdir -p "$_peers_site"
for _f in .peers/peers-*.tar.xz; do
  [ -f "$_f" ] || continue
  _m="$_peers_site/.$(basename "$_f").done"
  [ -f "$_m" ] || { tar -xJf "$_f" -C "$_peers_site" && touch "$_m" && echo "peers: extracted $_f"; }
done
# module:folder pairs the image may have already
for _p in cuda.bindings:cuda/bindings cuda.pathfinder:cuda/pathfinder google.protobuf:google/protobuf einops:einops \
          typing_extensions:typing_extensions.py; do
  if env -u PYTHONPATH python3 -c "import ${_p%%:*}" 2>/dev/null; then rm -rf "$_peers_site/${_p#*:}"; fi
done
for _d in "$_peers_site"/nvidia_cutlass_dsl/*packages*; do
  [ -d "$_d" ] && case ":${PYTHONPATH:-}:" in *":$_d:"*) ;; *) PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$_d" ;; esac
done
case ":${PYTHONPATH:-}:" in *":$_peers_site:"*) ;; *) PYTHONPATH="$_peers_site${PYTHONPATH:+:$PYTHONPATH}" ;; esac
export PYTHONPATH
for _mod in quack flash_attn.cute; do
  python3 -c "import $_mod" 2>/dev/null && echo "peers: $_mod imports" || echo "peers: $_mod does not import"
done
unset _peers_site _f _m _p _d _mod
