#!/usr/bin/env bash
# Build what the scheduler tests need from the Go module proxy, cached like the control plane:
#   <out>/kueue                     the Kueue manager (sigs.k8s.io/kueue, pinned in kueue/go.mod)
#   <out>/crds/kueue/*.yaml         Kueue's CRDs, from that module
# Prints <out>. Volcano (volcano/build.sh) and KAI (kai/build.sh) have their own scripts and caches.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
stamp=$(cat "$here"/kueue/go.mod "$here"/kueue/go.sum | sha256sum | cut -c1-12)
out="$cache/schedulers/$stamp"
if [[ -x "$out/kueue" && -d "$out/crds/kueue" ]]; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial/crds/kueue"
start=$(date +%s)

cd "$here/kueue"
kueue_version=$(grep -o 'sigs.k8s.io/kueue v[^ ]*' go.mod | head -1 | cut -d' ' -f2)
echo "building kueue ${kueue_version} (cold: several minutes)..." >&2
# -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
# build takes less CPU: docs/development.md, "Building").
GOFLAGS=-mod=mod go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" -o "$out.partial/kueue" sigs.k8s.io/kueue/cmd/kueue
kueue_dir=$(GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
cp "$kueue_dir"/config/components/crd/bases/*.yaml "$out.partial/crds/kueue/"

rm -rf "$out"
mv "$out.partial" "$out"
echo "kueue and its CRDs built in $(( $(date +%s) - start ))s" >&2
echo "$out"
