#!/usr/bin/env bash
# Build the pinned control plane (kube-apiserver and etcd) from the Go module proxy.
#
# Versions are pinned in go.mod/go.sum next to this script. Output goes to
#   ${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/controlplane/<stamp>/{kube-apiserver,etcd}
# where <stamp> is a hash of go.mod, go.sum and this script: a warm machine skips the build entirely, and a
# change of pins builds into a fresh directory. Prints the binary directory on stdout.
#
#   e2e/controlplane/build.sh              build if needed, print the bin dir
#   e2e/controlplane/build.sh --print-replaces   the replace block for a new k8s.io/kubernetes pin
#   e2e/controlplane/build.sh --print-ldflags    the Go linker flags that stamp the version
#   e2e/controlplane/build.sh --oldest [...]     the same for the oldest Kubernetes minor the
#                                                chart accepts (pinned in oldest/go.mod)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script="$here/build.sh"
cd "$here"
if [[ "${1:-}" == "--oldest" ]]; then
  cd "$here/oldest"
  shift
fi

k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' go.mod)
[[ $k8s_version == v1.* ]] || { echo "no k8s.io/kubernetes version in $PWD/go.mod" >&2; exit 1; }

# Stamp the version into both places /version reads it from; without it a binary reports v0.0.0.
# Also used for the kind node image's binaries (e2e/kind/node-image.sh: --print-ldflags).
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${k8s_version} -X ${pkg}.gitMajor=1"
  ldflags+=" -X ${pkg}.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done
if [[ "${1:-}" == "--print-ldflags" ]]; then
  echo "$ldflags"
  exit 0
fi

if [[ "${1:-}" == "--print-replaces" ]]; then
  # Module zips omit nested modules: every ./staging/src/k8s.io/X replace of k8s.io/kubernetes
  # becomes the published k8s.io/X v0.<minor>.<patch>.
  staging_version="v0${k8s_version#v1}"
  dir=$(go mod download -json "k8s.io/kubernetes@${k8s_version}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  echo "replace ("
  awk '/=> \.\/staging\/src\// { print $1 }' "$dir/go.mod" | while read -r m; do
    if curl -fsS -o /dev/null "${GOPROXY%%,*}/$m/@v/${staging_version}.info" 2>/dev/null; then
      printf '\t%s => %s %s\n' "$m" "$m" "$staging_version"
    fi
  done
  echo ")"
  exit 0
fi

cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
stamp=$(cat go.mod go.sum "$script" | sha256sum | cut -c1-12)
out="$cache/controlplane/${k8s_version}-${stamp}"

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
  echo "$out"
  exit 0
fi

# One build at a time (CI's kind preparation runs beside `make controlplane`): a second caller
# waits, then finds the first one's result.
mkdir -p "$cache/controlplane"
exec 9>"$cache/controlplane/.lock"
flock 9
if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
  echo "$out"
  exit 0
fi
mkdir -p "$out.partial"
start=$(date +%s)
echo "building kube-apiserver ${k8s_version} and etcd (cold: ~6-10 min on 2 cores)..." >&2
# Static (no cgo): the kind node image (e2e/kind/node-image.sh) runs these very binaries in
# images that hold nothing else.
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
go build -trimpath -ldflags "$ldflags" -o "$out.partial/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "-s -w" -o "$out.partial/etcd" go.etcd.io/etcd/server/v3
rm -rf "$out"
mv "$out.partial" "$out"
echo "control plane built in $(( $(date +%s) - start ))s" >&2
echo "$out"
