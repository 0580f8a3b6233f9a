#!/usr/bin/env bash
# Build the pinned Go tools (Helm: go.mod here; actionlint: actionlint/go.mod; helm-docs:
# helm-docs/go.mod) into the cache and print the directory holding them.
#   e2e/tools/build.sh    ->  ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/tools/<stamp>
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
out="$cache/tools/$(cat go.mod go.sum actionlint/go.mod actionlint/go.sum helm-docs/go.mod helm-docs/go.sum build.sh | sha256sum | cut -c1-12)"
built() { [[ -x "$out/helm" && -x "$out/actionlint" && -x "$out/helm-docs" ]]; }
if built; then
  echo "$out"
  exit 0
fi
# One build at a time: tests that need a tool may call this together on a fresh cache (the chart
# tests do); the others wait for the lock and take what the first built.
mkdir -p "$cache/tools"
exec 9>"$cache/tools/.lock"
flock 9
if built; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial"
start=$(date +%s)
helm_version=$(awk '$1 == "helm.sh/helm/v3" { print $2; exit }' go.mod)
# As Helm's own Makefile does: the Kubernetes version of its client modules (v0.37.0 -> 1.37)
# is what `helm template` and `helm lint` assume without a cluster (else v1.20).
k8s_minor=$(awk '$1 == "k8s.io/client-go" { split($2, v, "."); print v[2]; exit }' go.mod)
echo "building helm ${helm_version} (cold: ~2 min)..." >&2
GOFLAGS=-mod=mod go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version} \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${k8s_minor} \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${k8s_minor}" \
  -o "$out.partial/helm" helm.sh/helm/v3/cmd/helm
# -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
# build takes less CPU: docs/development.md, "Building").
(cd actionlint && GOFLAGS=-mod=mod go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" \
  -o "$out.partial/actionlint" github.com/rhysd/actionlint/cmd/actionlint)
# -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
# build takes less CPU: docs/development.md, "Building").
(cd helm-docs && GOFLAGS=-mod=mod go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" \
  -o "$out.partial/helm-docs" github.com/norwoodj/helm-docs/cmd/helm-docs)
rm -rf "$out"
mv "$out.partial" "$out"
echo "tools built in $(( $(date +%s) - start ))s" >&2
echo "$out"
