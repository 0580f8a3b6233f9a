#!/usr/bin/env bash
# Render the benchmark timeline (CSV) to a PNG with matplotlib from PyPI (cached venv).
#   e2e/bench/chart.sh docs/benchmarks.csv docs/benchmarks.png
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
venv="$cache/venv-bench-chart"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "matplotlib==3.10.*"
fi
"$venv/bin/python" "$here/chart.py" "$1" "$2"
