#!/usr/bin/env bash
# Build the pinned Go tools (Helm: go.mod here; actionlint: actionlint/go.mod) into the cache and print the directory holding them.
#   e2e/tools/build.sh    ->  ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/tools/<stamp>
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/tools/$(cat go.mod go.sum actionlint/go.mod actionlint/go.sum build.sh | sha256sum | cut -c1-12)"
if [[ -x "$out/helm" && -x "$out/actionlint" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.partial"
start=$(date +%s)
helm_version=$(awk '$1 == "helm.sh/helm/v3" { print $2; exit }' go.mod)
echo "building helm ${helm_version} (cold: ~2 min)..." >&2
GOFLAGS=-mod=mod go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}" \
  -o "$out.partial/helm" helm.sh/helm/v3/cmd/helm
(cd actionlint && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
  -o "$out.partial/actionlint" github.com/rhysd/actionlint/cmd/actionlint)
rm -rf "$out"
mv "$out.partial" "$out"
echo "tools built in $(( $(date +%s) - start ))s" >&2
echo "$out"
