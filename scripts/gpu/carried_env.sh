# Source on the device (bash), from the repo root, at the top of a device script:
#   . scripts/gpu/carried_env.sh
# hearth from source (PYTHONPATH=src), then what the call carried: the wheels under .whl/ (Liger, pydantic, ...)
# installed into /tmp/site and put on PYTHONPATH; the CuTe-DSL peers (quack, FlashAttention-4) where a part of
# them was carried (scripts/gpu/peer_wheels.sh; peers_env.sh keeps it until the last part comes, then extracts them; a no-op otherwise); and the CuTe DSL's
# package folder, normally added by a .pth file that `pip install --target` does not run. The site folder is
# /tmp/site ($HEARTH_SITE when set).
_site=${HEARTH_SITE:-/tmp/site}
export PYTHONPATH=src
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$_site" .whl/*.whl && export PYTHONPATH="src:$_site"
fi
if ls .peers/peers.tar.xz.*of* >/dev/null 2>&1; then . scripts/gpu/peers_env.sh; fi
for _d in "$_site"/nvidia_cutlass_dsl/*packages*; do
  [ -d "$_d" ] && case ":$PYTHONPATH:" in *":$_d:"*) ;; *) export PYTHONPATH="$PYTHONPATH:$_d" ;; esac
done
unset _d _site
