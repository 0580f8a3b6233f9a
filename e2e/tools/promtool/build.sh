#!/usr/bin/env bash
# Build promtool (github.com/prometheus/prometheus, pinned in go.mod here) into the cache and
# print the directory holding it. Its service-discovery plugins are left out (`remove_all_sd`):
# `promtool test rules` needs none of them, and the cloud SDKs would dominate the build.
#   e2e/tools/promtool/build.sh  ->  ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/promtool/<stamp>
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/promtool/$(cat go.mod go.sum build.sh | sha256sum | cut -c1-12)"
if [[ -x "$out/promtool" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.partial"
start=$(date +%s)
echo "building promtool $(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" { print $3 }' go.mod) (cold: a few minutes)..." >&2
# -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
# build takes less CPU: docs/development.md, "Building").
GOFLAGS=-mod=mod go build -trimpath -gcflags="all=-N -l" -tags remove_all_sd,netgo,builtinassets -ldflags "-s -w" \
  -o "$out.partial/promtool" github.com/prometheus/prometheus/cmd/promtool
rm -rf "$out"
mv "$out.partial" "$out"
echo "promtool built in $(( $(date +%s) - start ))s" >&2
echo "$out"
