# Sourced by the bench/gpu_*.sh scripts and bench/pyg_vs_fanout_gpu.sh: puts the driver's and,
# where the default search path lacks them, NVRTC's and cuBLAS's libraries on LD_LIBRARY_PATH
# (fanout loads all three at run time), and defines `step`, which prints a timed section header.
# The scripts' timeouts are `timeout -k 5`: fanout answers SIGTERM by stopping at the next step,
# and a run stuck inside a step would otherwise outlive its timeout and the device call.
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for lib in libnvrtc.so libcublas.so; do
  if ! grep -q "$lib" <(ldconfig -p); then # not `ldconfig -p | grep -q`: under pipefail its SIGPIPE fails
    dir=$(find /usr/local /usr/lib /opt \( -name "$lib" -o -name "$lib.*" \) -print -quit 2>/dev/null | xargs -r dirname)
    [ -n "$dir" ] && export LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH"
  fi
done
step() { echo; echo "=== $* ($(date +%T))"; }
