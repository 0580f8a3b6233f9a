#!/usr/bin/env bash
# The e2e suite on kind, for machines with Docker: the chart installed for real, the controller
# and mock-ec2 as images, and the same e2e test binary CI runs against its own kube-apiserver.
#
#   e2e/kind/run.sh          create (or reuse) the cluster, build, install, test
#   e2e/kind/run.sh --down   delete the cluster
#
# Needs: docker, kind, kubectl, helm (or e2e/tools/build.sh builds helm), cargo.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=ec2tl-e2e
namespace=ec2-topology-labeler
work=${E2E_KIND_WORK:-${TMPDIR:-/tmp}/ec2tl-kind}

if [[ "${1:-}" == "--down" ]]; then
  kind delete cluster --name "$cluster"
  exit 0
fi

for tool in docker kind kubectl cargo; do
  command -v "$tool" >/dev/null || { echo "$tool is required for the kind path" >&2; exit 1; }
done
helm=$(command -v helm || echo "$("$root/e2e/tools/build.sh")/helm")
mkdir -p "$work"

if ! kind get clusters | grep -qx "$cluster"; then
  kind create cluster --config "$here/kind-config.yaml" --wait 120s
fi
kubeconfig="$work/kubeconfig"
kind get kubeconfig --name "$cluster" > "$kubeconfig"
export KUBECONFIG="$kubeconfig"

docker build -t ec2-topology-labeler:e2e "$root"
docker build --build-arg PACKAGE=mock-ec2 -t mock-ec2:e2e "$root"
kind load docker-image --name "$cluster" ec2-topology-labeler:e2e mock-ec2:e2e

kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -f "$here/mock-ec2.yaml"
kubectl -n "$namespace" rollout status deploy/mock-ec2 --timeout=120s
"$helm" upgrade --install ec2-topology-labeler "$root/charts/ec2-topology-labeler" \
  --namespace "$namespace" -f "$here/values.yaml" --wait --timeout 180s

kubectl -n "$namespace" port-forward svc/mock-ec2 18080:8080 >"$work/port-forward.log" 2>&1 &
forward=$!
trap 'kill "$forward" 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  curl -fsS http://127.0.0.1:18080/_admin/stats >/dev/null 2>&1 && break
  sleep 0.2
done

cd "$root"
E2E_KUBECONFIG="$kubeconfig" E2E_MOCK_EC2_URL=http://127.0.0.1:18080 \
  cargo build --workspace --bins
E2E_KUBECONFIG="$kubeconfig" E2E_MOCK_EC2_URL=http://127.0.0.1:18080 \
  cargo test --workspace --test e2e
