#!/usr/bin/env bash
# Build cosign (github.com/sigstore/cosign, pinned in go.mod here) into the cache and print the
# directory holding it. hack/release.sh signs with it; the kind suite verifies with it.
#   e2e/tools/cosign/build.sh  ->  ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/cosign/<stamp>
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/cosign/$(cat go.mod go.sum build.sh | sha256sum | cut -c1-12)"
if [[ -x "$out/cosign" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.partial"
start=$(date +%s)
version=$(awk '$1 == "require" && $2 == "github.com/sigstore/cosign/v3" { print $3 }' go.mod)
echo "building cosign $version (cold: a few minutes)..." >&2
# -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
# build takes less CPU: docs/development.md, "Building").
GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -gcflags="all=-N -l" \
  -ldflags "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$version" \
  -o "$out.partial/cosign" github.com/sigstore/cosign/v3/cmd/cosign
rm -rf "$out"
mv "$out.partial" "$out"
echo "cosign built in $(( $(date +%s) - start ))s" >&2
echo "$out"
