#!/usr/bin/env bash
# KAI-Scheduler's source at the pinned commit, for the scheduler tests:
#   source.sh <dir>   fills <dir>/kai-scheduler/ (cmd/, pkg/, deployments/, go.mod, go.sum)
# From, in this order:
#   1. a snapshot tarball, for machines that reach neither GitHub nor the Go module proxy:
#      $EC2TL_UPSTREAM/kai/kai-scheduler-src.tar.xz if EC2TL_UPSTREAM is set, else
#      ../shared/upstream/kai/ beside the checkout if it is there; checked against its SHA-256
#      (pinned below) and refused if it differs;
#   2. otherwise KAI's Go module at the pinned commit from the Go module proxy (`go mod
#      download`), checked by the Go checksum database (sum.golang.org) as every module is.
# Nothing outside the checkout is needed where the proxy is reachable.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
# NVIDIA/KAI-Scheduler, after v0.13.0: the commit the tests and the docs were written against.
KAI_MODULE=github.com/NVIDIA/KAI-scheduler
KAI_COMMIT=72de64fc8eca10fa8cca26a20156178f3edbe092
# The snapshot of that commit (cmd/, pkg/, deployments/, go.mod, go.sum, LICENSE, NOTICE).
SNAPSHOT_SHA256=667b22e14d0902ae7a789c5ab48c88e3110e1d35d339b4418599c537249b9d8d

dest=${1:?usage: source.sh <dir>}
mkdir -p "$dest"
if [[ -n "${EC2TL_UPSTREAM:-}" ]]; then
  snapshot="$EC2TL_UPSTREAM/kai/kai-scheduler-src.tar.xz"
  [[ -f "$snapshot" ]] || { echo "EC2TL_UPSTREAM is set but $snapshot is missing" >&2; exit 1; }
else
  snapshot="$repo/../shared/upstream/kai/kai-scheduler-src.tar.xz"
fi
if [[ -f "$snapshot" ]]; then
  got=$(sha256sum "$snapshot" | cut -d' ' -f1)
  if [[ "$got" != "$SNAPSHOT_SHA256" ]]; then
    echo "refusing $snapshot: SHA-256 $got, expected $SNAPSHOT_SHA256 (KAI at $KAI_COMMIT)" >&2
    exit 1
  fi
  echo "KAI source: the snapshot $snapshot (SHA-256 checked)" >&2
  tar -xJf "$snapshot" -C "$dest"
  exit 0
fi
echo "KAI source: $KAI_MODULE@$KAI_COMMIT from the Go module proxy (checked by the checksum database)" >&2
# A scratch module to run `go mod download` in (the command needs none, but GOFLAGS may).
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
json=$(cd "$scratch" && GOFLAGS=-mod=mod go mod download -json "$KAI_MODULE@$KAI_COMMIT" 2>&1) || json="$json"$'\n'"(go mod download failed)"
dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"$json")
[[ -n "$dir" && -f "$dir/go.mod" ]] || {
  echo "cannot download $KAI_MODULE@$KAI_COMMIT from the Go module proxy; offline, set EC2TL_UPSTREAM to a directory holding kai/kai-scheduler-src.tar.xz. Go said:" >&2
  grep -E '"Error"|failed' <<<"$json" >&2 || tail -3 <<<"$json" >&2
  exit 1
}
mkdir -p "$dest/kai-scheduler"
cp -R "$dir/." "$dest/kai-scheduler/"
chmod -R u+w "$dest/kai-scheduler"
