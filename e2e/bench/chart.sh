#!/usr/bin/env bash
# Render the benchmark charts with matplotlib from PyPI (cached venv).
#   e2e/bench/chart.sh docs/benchmarks.csv docs/benchmarks.png                 (timeline)
#   e2e/bench/chart.sh --scale docs/benchmarks-scale.csv docs/benchmarks-scale.png  (RSS, calls vs nodes)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
venv="$cache/venv-bench-chart"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "matplotlib==3.10.*"
fi
if [[ "${1:-}" == "--scale" ]]; then
  "$venv/bin/python" "$here/chart_scale.py" "$2" "$3"
else
  "$venv/bin/python" "$here/chart.py" "$1" "$2"
fi
