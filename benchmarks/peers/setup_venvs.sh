#!/usr/bin/env bash
# Create the peer libraries' virtual environments on demand (idempotent).
#
# Usage: benchmarks/peers/setup_venvs.sh [pecos|pecos-xrt|napkinxc|omikuji|libmultilabel ...]   (default: all)
#
# Each peer gets its own venv under benchmarks/.venvs/<name> (git-ignored) because their pins
# clash with the main stack: libpecos pins numpy<2 and scipy<1.14. libpecos is installed with
# --no-deps so that it does not pull what it does not use (XLinear needs no torch; XR-Transformer
# needs torch and transformers < 4.48, but none of peft, datasets or sentencepiece). Where a venv
# needs torch it is installed first and pinned (XMC_BENCH_TORCH, default torch==2.13.0, the main
# stack's), so that nothing resolved after it pulls another torch. A venv counts as ready only
# once its import check passed and wrote the .ready marker, so a killed install is redone.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$(realpath -m "${XMC_BENCH_VENVS:-$HERE/../.venvs}")"
PYTHON="${XMC_BENCH_PYTHON:-python3}"
TORCH="${XMC_BENCH_TORCH:-torch==2.13.0}"

declare -A FIRST=(
  [pecos-xrt]="$TORCH"
)
declare -A PACKAGES=(
  [pecos]="numpy<2 scipy<1.14 scikit-learn"
  [pecos-xrt]="$TORCH numpy<2 scipy<1.14 scikit-learn transformers>=4.46,<4.47"
  [napkinxc]="numpy<2 scipy napkinxc"
  [omikuji]="numpy<2 scipy omikuji"
  [libmultilabel]="libmultilabel==0.10.0"
)
declare -A NODEPS=(
  [pecos]="libpecos==1.2.8"
  [pecos-xrt]="libpecos==1.2.8"
)
declare -A CHECKS=(
  [pecos]="from pecos.xmc.xlinear.model import XLinearModel; from pecos.xmc import Indexer, LabelEmbeddingFactory"
  [pecos-xrt]="from pecos.xmc.xtransformer.model import XTransformer; import torch, transformers"
  [napkinxc]="from napkinxc.models import PLT"
  [omikuji]="import omikuji"
  [libmultilabel]="import libmultilabel.linear"
)

setup_one() {
  local name="$1"
  if [[ -z "${PACKAGES[$name]+x}" ]]; then
    echo "setup_venvs: unknown peer '$name' (known: ${!PACKAGES[*]})" >&2
    return 2
  fi
  local dir="$VENVS/$name"
  if [[ -f "$dir/.ready" ]]; then
    echo "$dir/bin/python"
    return 0
  fi
  echo "setup_venvs: creating $dir" >&2
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  if [[ -n "${FIRST[$name]+x}" ]]; then
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install -q --disable-pip-version-check ${FIRST[$name]} >&2
  fi
  # shellcheck disable=SC2086
  "$dir/bin/python" -m pip install -q --disable-pip-version-check ${PACKAGES[$name]} >&2
  if [[ -n "${NODEPS[$name]+x}" ]]; then
    # shellcheck disable=SC2086
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps ${NODEPS[$name]} >&2
  fi
  "$dir/bin/python" -c "${CHECKS[$name]}"
  "$dir/bin/python" -m pip freeze --disable-pip-version-check > "$dir/.ready"
  echo "$dir/bin/python"
}

if [[ $# -eq 0 ]]; then
  set -- pecos pecos-xrt napkinxc omikuji libmultilabel
fi
for peer in "$@"; do
  setup_one "$peer"
done
