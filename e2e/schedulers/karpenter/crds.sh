#!/usr/bin/env bash
# Karpenter's NodePool CRD, from the sigs.k8s.io/karpenter module on the Go module proxy (nothing
# is built: the docs' NodePool recipes are checked against it by a server-side dry run). Cached
# under $EC2TL_CACHE by version; prints the directory holding the CRD.
set -euo pipefail
version=v1.13.0 # the newest the local Go (1.26.8) accepts; v1.14+ ask for a newer toolchain
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/schedulers/karpenter-$version"
if [[ -f "$out/karpenter.sh_nodepools.yaml" ]]; then
  echo "$out"
  exit 0
fi
cd "${TMPDIR:-/tmp}" # outside any go.mod
dir=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/karpenter@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -f "$dir/pkg/apis/crds/karpenter.sh_nodepools.yaml" ]] || { echo "no NodePool CRD in $dir" >&2; exit 1; }
rm -rf "$out.partial"
mkdir -p "$out.partial"
cp "$dir/pkg/apis/crds/karpenter.sh_nodepools.yaml" "$out.partial/"
rm -rf "$out"
mv "$out.partial" "$out"
echo "$out"
