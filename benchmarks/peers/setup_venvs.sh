#!/usr/bin/env bash
# Create the peer libraries' virtual environments on demand (idempotent).
#
# Usage: benchmarks/peers/setup_venvs.sh [pecos|napkinxc|omikuji ...]   (default: all)
#
# Each peer gets its own venv under benchmarks/.venvs/<name> (git-ignored) because their pins
# clash with the main stack: libpecos pins numpy<2 and scipy<1.14. libpecos is installed with
# --no-deps so that it does not pull torch (its XLinear needs none). A venv counts as ready only
# once its import check passed and wrote the .ready marker, so a killed install is redone.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENVS="$(realpath -m "${XMC_BENCH_VENVS:-$HERE/../.venvs}")"
PYTHON="${XMC_BENCH_PYTHON:-python3}"

declare -A PACKAGES=(
  [pecos]="numpy<2 scipy<1.14 scikit-learn"
  [napkinxc]="numpy<2 scipy napkinxc"
  [omikuji]="numpy<2 scipy omikuji"
)
declare -A NODEPS=(
  [pecos]="libpecos"
)
declare -A CHECKS=(
  [pecos]="from pecos.xmc.xlinear.model import XLinearModel; from pecos.xmc import Indexer, LabelEmbeddingFactory"
  [napkinxc]="from napkinxc.models import PLT"
  [omikuji]="import omikuji"
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
  set -- pecos napkinxc omikuji
fi
for peer in "$@"; do
  setup_one "$peer"
done
