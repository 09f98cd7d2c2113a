#!/usr/bin/env bash
# Issue 55's GPU measurement in one command, ready for the moment a GPU is lent: installs
# what that machine lacks from the carried wheels, then runs bench/gpu.py (its docstring
# says what it measures; docs/trainer.md#gpu-performance how to call it on a lent GPU).
#
#   bash bench/gpu.sh [--budget 500] [--only CASE,...]   # on a GPU; $OUT set: files there
#   bash bench/gpu.sh --cpu-smoke                         # CPU, tiny models, no install
#
# Before a lent-GPU call, in the checkout the session started in (the one the device
# tool sends): python bench/gpu_wheels.py fetch (bench/gpu-wheels/, git-ignored, ~19 MiB),
# then the call: run(command="bash bench/gpu.sh", carry=["bench/gpu-wheels"],
# timeout_s=600). The table ends the output; gpu.md, gpu.json and gpu-logs.tar.gz land in
# $OUT (docs/trainer.md#gpu-performance).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
out=()
if [ -n "${OUT:-}" ]; then out=(--out "$OUT"); fi
for arg in "$@"; do
  if [ "$arg" = "--cpu-smoke" ]; then
    exec python3 bench/gpu.py "$@" "${out[@]}"
  fi
done

# The training stack, importable as the benches' processes will import it.
ready() {
  python3 - <<'PY' 2>/dev/null
import importlib.metadata as m
import datasets, omegaconf, torchao, torchtune, kubetune.trainer.launch  # noqa: F401
assert int(m.version("huggingface_hub").split(".")[0]) >= 2
PY
}
if ! ready; then
  site=/tmp/kubetune-site
  if ! ls bench/gpu-wheels/*.whl >/dev/null 2>&1; then
    echo "error: the training stack is missing here and bench/gpu-wheels/ holds no wheels:" \
         "run python bench/gpu_wheels.py fetch where an index is reachable, and carry" \
         "bench/gpu-wheels with the call" >&2
    exit 1
  fi
  python3 bench/gpu_wheels.py install "$site" || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  if ! ready; then
    echo "error: the carried wheels installed into $site but the training stack still" \
         "does not import:" >&2
    python3 -c "import datasets, omegaconf, torchao, torchtune, kubetune.trainer.launch" >&2
    exit 1
  fi
fi
exec python3 bench/gpu.py "$@" "${out[@]}"
