# Source on the device (bash), from the repo root, after carrying a part of the CuTe-DSL peers
# (.peers/peers.tar.xz.<k>of<n>, scripts/gpu/peer_wheels.sh):
#   . scripts/gpu/peers_env.sh
# Keeps each carried part in the site folder (/tmp/site, or $HEARTH_SITE when set) until the last of the n has come
# (one call each, on the same warm machine), then extracts the joined archive once (a marker file; later calls add
# nothing), leaves out the packages the image already imports (the image's copies stay in charge: a PYTHONPATH entry
# would shadow them), and puts the site and the CuTe DSL's package folder (normally added by a .pth file, which
# extracting does not run) on PYTHONPATH. Prints how many parts it holds, and whether quack and flash_attn.cute import.
_peers_site=${HEARTH_SITE:-/tmp/site}  # the site folder (HEARTH_SITE: elsewhere, e.g. a test's)
_peers_parts="$_peers_site/.peers-parts"
if [ ! -f "$_peers_site/.peers.done" ]; then
  mkdir -p "$_peers_parts"
  for _f in .peers/peers.tar.xz.*of*; do
    [ -f "$_f" ] && cp "$_f" "$_peers_parts/"
  done
  _n=
  for _f in "$_peers_parts"/peers.tar.xz.*of*; do
    [ -f "$_f" ] || continue
    _k=${_f##*of}
    if [ -n "$_n" ] && [ "$_k" != "$_n" ]; then
      echo "peers: parts of two different cuts in $_peers_parts (of $_n and of $_k); carry one set" >&2; _n=bad; break
    fi
    _n=$_k
  done
  if [ -n "$_n" ] && [ "$_n" != bad ]; then
    _have=0; _list=()
    for _k in $(seq 1 "$_n"); do
      [ -f "$_peers_parts/peers.tar.xz.${_k}of${_n}" ] && { _have=$(( _have + 1 )); _list+=("$_peers_parts/peers.tar.xz.${_k}of${_n}"); }
    done
    if [ "$_have" -eq "$_n" ]; then
      # --ignore-zeros: an archive joined from several tars (scripts/gpu/peers_split.sh) extracts whole
      if cat "${_list[@]}" | tar -xJ --ignore-zeros -C "$_peers_site"; then
        touch "$_peers_site/.peers.done" && rm -rf "$_peers_parts" && echo "peers: extracted $_n part(s)"
      else
        echo "peers: the $_n parts did not extract (a part damaged, or parts of two cuts)" >&2
      fi
    else
      echo "peers: $_have of $_n parts here; carry the others, one call each, on this warm machine"
    fi
  fi
fi
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
unset _peers_site _peers_parts _f _n _k _have _list _p _d _mod
