#!/usr/bin/env bash
# Graphviz's dot, which judges `tree -o dot` (crates/core/tests/pictures.rs): Debian's package.
#   e2e/tools/graphviz.sh    idempotent; prints nothing on stdout; needs root (apt)
set -euo pipefail
command -v dot >/dev/null && exit 0
echo "[graphviz] installing graphviz (apt)" >&2
export DEBIAN_FRONTEND=noninteractive
flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends graphviz >&2
