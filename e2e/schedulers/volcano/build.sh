#!/usr/bin/env bash
# Build Volcano for the scheduler tests from the Go module proxy, cached by a hash of its inputs
# (go.mod, go.sum and this script):
#   <out>/vc-scheduler            Volcano's scheduler (volcano.sh/volcano/cmd/scheduler)
#   <out>/vc-controller-manager   its controller-manager: Job, PodGroup, Queue and HyperNode
#                                 (label discovery) controllers
#   <out>/crds/*.yaml             Volcano's CRDs, as the module ships them (config/crd/volcano/bases)
#   <out>/chart/                  Volcano's Helm chart (installer/helm/chart/volcano): the tests render
#                                 it with the values docs/schedulers.md shows
# Prints <out>.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
stamp=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
out="$cache/schedulers/volcano/$stamp"
if [[ -x "$out/vc-scheduler" && -x "$out/vc-controller-manager" && -d "$out/crds" && -d "$out/chart" ]]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/crds"
start=$(date +%s)
cd "$here"
version=$(awk '$1 == "volcano.sh/volcano" { print $2; exit }' go.mod)
for cmd in scheduler controller-manager; do
  t=$(date +%s)
  echo "building volcano ${version} ${cmd} (cold: several minutes)..." >&2
  # -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
  # build takes less CPU: docs/development.md, "Building").
  go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" -o "$out.partial/vc-${cmd}" "volcano.sh/volcano/cmd/${cmd}"
  echo "vc-${cmd} built in $(( $(date +%s) - t ))s" >&2
done
dir=$(go list -m -f '{{.Dir}}' volcano.sh/volcano)
cp "$dir"/config/crd/volcano/bases/*.yaml "$out.partial/crds/"
cp -r "$dir/installer/helm/chart/volcano" "$out.partial/chart"
chmod -R u+w "$out.partial/crds" "$out.partial/chart"

rm -rf "$out"
mv "$out.partial" "$out"
echo "volcano built in $(( $(date +%s) - start ))s" >&2
echo "$out"
