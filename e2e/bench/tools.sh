#!/usr/bin/env bash
# The baseline script's tools, all from this machine's registries, cached:
#   aws (the AWS CLI v1 from PyPI), jq (gojq, a jq implementation, from the Go module proxy),
#   kubectl (from the pinned k8s.io/kubernetes in e2e/controlplane). Prints the directory.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
awscli=awscli==1.46.3
stamp=$(cat "$root/e2e/tools/go.sum" "$root/e2e/controlplane/go.sum" <(echo "$awscli") | sha256sum | cut -c1-12)
out="$cache/bench-tools/$stamp"
mkdir -p "$out"
if [[ ! -x "$out/aws" ]]; then
  python3 -m venv "$cache/venv-bench-aws"
  "$cache/venv-bench-aws/bin/pip" install --quiet --disable-pip-version-check "$awscli"
  ln -sf "$cache/venv-bench-aws/bin/aws" "$out/aws"
fi
if [[ ! -x "$out/jq" ]]; then
  (cd "$root/e2e/tools" && GOFLAGS=-mod=mod go build -trimpath -o "$out/jq" github.com/itchyny/gojq/cmd/gojq)
fi
if [[ ! -x "$out/kubectl" ]]; then
  (cd "$root/e2e/controlplane" && GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl)
fi
echo "$out"
