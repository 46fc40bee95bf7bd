#!/bin/bash
# The GPU job, started detached by run.sh from the checkout's root with .gpu/ beside it: unpack and
# build, then python -m benchmarks.run for ours (trainer=gpu) and for PECOS's XR-Transformer (its GPU path).
# SYSTEMS: which systems, in order (default "ours-xrtransformer pecos-xrt"; one a time where the
# machine's minutes cannot hold both); TAG: the tables' tag before the system's name (default gpu).
# For a rehearsal on a CPU host: J (job folder), STEPS_SCALE,
# EXTRA (more harness flags, e.g. "--max-docs 300"), OURS_EXTRA (e.g. "--xr-override trainer=cpu").
set -u
R=$(pwd); G=$(basename "$(dirname "$0")"); J=${J:-/tmp/job}; DATASET=${DATASET:-eurlex57k}; T0=$(date +%s)
stamp() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$J/progress.txt"; }
fail() { stamp "$1"; touch "$J/done"; exit 1; }
stamp start
# the GPU's load every 10 s, to tell a system that waits on the CPU from one that computes on the GPU
( while [ ! -f "$J/done" ]; do echo "$(date -u +%H:%M:%S) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)" >> "$J/gpu.txt"; sleep 10; done ) &
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$J/host.txt" 2>&1
PY=$(command -v python3)
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl > "$J/setup.log" 2>&1 || fail "pip failed"
if [ -f "$G"/enc.tar.xz ]; then cp "$G"/enc.tar.xz /tmp/enc.tar.xz; else cat /tmp/enc-parts/part* > /tmp/enc.tar.xz; fi  # or run.sh put's parts
tar xJf "$G"/pecos_site.tar.xz -C /tmp && tar xJf /tmp/enc.tar.xz -C /tmp && mkdir -p "/tmp/data/$DATASET" && tar xJf "$G"/data.tar.xz -C "/tmp/data/$DATASET" \
  || fail "unpacking failed"
tar xJf "$G"/cpp.tar.xz -C src/xtransformer && $PY setup.py build_ext --inplace -j "$(nproc)" >> "$J/setup.log" 2>&1 || fail "build failed"
export PYTHONPATH=/tmp/site:$R/src XMC_DATA_DIR=/tmp/data XMC_BENCH_VENVS=/tmp/venvs PYTHONUNBUFFERED=1
mkdir -p /tmp/venvs/pecos-xrt/bin  # PECOS's environment: this python with its own site first
printf '#!/bin/sh\nexport PYTHONPATH=/tmp/pxt\nexec %s "$@"\n' "$PY" > /tmp/venvs/pecos-xrt/bin/python
chmod +x /tmp/venvs/pecos-xrt/bin/python && touch /tmp/venvs/pecos-xrt/.ready
$PY -c "import torch, transformers, xtransformer; print('ours: torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)" >> "$J/host.txt" 2>&1
/tmp/venvs/pecos-xrt/bin/python -c "import pecos, transformers; from pecos.xmc.xtransformer.model import XTransformer; print('pecos', pecos.__version__, 'transformers', transformers.__version__)" >> "$J/host.txt" 2>&1
stamp "setup done"
# shellcheck disable=SC2206
XR=(--xr-override experiment=eurlex57k_xr_ensemble --xr-override trainer=gpu --xr-override matcher.model_name_or_path=/tmp/enc ${OURS_EXTRA:-})
# shellcheck disable=SC2206
COMMON=(--dataset "$DATASET" --threads "$(nproc)" --timeout 3600 --out "$J/out" --work /tmp/work ${EXTRA:-})
for system in ${SYSTEMS:-ours-xrtransformer pecos-xrt}; do  # one harness run each: a table as soon as one ends
  log=$J/${system%%-*}.log
  $PY -m benchmarks.run "${COMMON[@]}" --systems "$system" --steps-scale "${STEPS_SCALE:-1}" --tag "${TAG:-gpu}-$system" "${XR[@]}" > "$log" 2>&1
  stamp "$system rc $?"
done
touch "$J/done"
