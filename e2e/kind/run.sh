#!/usr/bin/env bash
# The e2e suite on a kind cluster, from nothing, on a machine with no registry:
#   1. host.sh: Docker engine, the egress guard (before any container), the runc wrapper where
#      privileged containers need it;
#   2. the kind CLI and the node image, built locally (node-image.sh), cached by their inputs;
#   3. the controller and mock-ec2 images (static musl binaries FROM scratch, e2e/image/build.sh);
#   4. a cluster of a control plane and a worker whose kubelets have EC2 providerIDs, a bridge
#      CNI, mock-ec2 in the cluster;
#   5. the tests: `install::` (the chart installed with Helm as the README says), the shared e2e
#      suite against the installed chart, then `ops::` (leader pod deleted, drain, upgrade,
#      uninstall), then `creds::` (IRSA and EKS Pod Identity against the stand-ins; only these
#      with E2E_KIND_ONLY=creds). Every image is used with pulls disabled.
#
#   e2e/kind/run.sh            all of it; the cluster is deleted at the end
#   e2e/kind/run.sh --prepare  only steps 1-3 (CI runs them in the background, at low priority,
#                              while the other suites run)
#   e2e/kind/run.sh --keep     leave the cluster running (its kubeconfig is printed)
#   e2e/kind/run.sh --down     delete the cluster
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
cluster=ec2tl-e2e
namespace=ec2-topology-labeler
work=${E2E_KIND_WORK:-$cache/kind/run}
start=$(date +%s)
step() { echo "[kind] $1 at +$(( $(date +%s) - start ))s" >&2; }

keep=false
case "${1:-}" in
  --keep) keep=true ;;
  --down | --prepare | "") ;;
  *) echo "usage: $0 [--prepare|--keep|--down]" >&2; exit 2 ;;
esac

step "host: Docker engine, egress guard, runc wrapper if needed"
"$here/host.sh"

step "kind CLI"
kind_bin="$cache/kind/cli-$(cat "$here/tools/go.mod" "$here/tools/go.sum" | sha256sum | cut -c1-12)"
if [[ ! -x "$kind_bin/kind" ]]; then
  (cd "$here/tools" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$kind_bin.partial/kind" sigs.k8s.io/kind)
  rm -rf "$kind_bin" && mv "$kind_bin.partial" "$kind_bin"
fi
kind() { "$kind_bin/kind" "$@"; }

if [[ "${1:-}" == "--down" ]]; then
  kind delete cluster --name "$cluster"
  exit 0
fi

step "node image (cached by its inputs; cold: debootstrap + Go builds)"
node_image=$("$here/node-image.sh")

step "controller and mock-ec2 images (static musl, dev profile)"
"$root/e2e/image/build.sh" --dev --docker \
  ec2-topology-labeler=ec2-topology-labeler:e2e mock-ec2=mock-ec2:e2e

if [[ "${1:-}" == "--prepare" ]]; then
  step "prepared"
  exit 0
fi

step "cluster"
rm -rf "$work"
mkdir -p "$work"
kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
# kind's network, made here IPv4-only (kind would add IPv6); the egress guard covers it like
# every bridge.
docker network inspect kind >/dev/null 2>&1 ||
  docker network create --driver bridge -o com.docker.network.bridge.enable_ip_masquerade=true kind >/dev/null
mock_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
sed "s/@MOCK_PORT@/$mock_port/" "$here/kind-config.yaml" >"$work/kind-config.yaml"
kubeconfig="$work/kubeconfig"
cleanup() {
  local rc=$?
  if ((rc != 0)); then
    kind export logs "$work/logs" --name "$cluster" >/dev/null 2>&1 &&
      echo "[kind] failed; cluster logs in $work/logs" >&2
  fi
  if [[ $keep == false ]]; then
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  else
    echo "[kind] cluster kept: KUBECONFIG=$kubeconfig; mock-ec2 at http://127.0.0.1:$mock_port" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
kind create cluster --name "$cluster" --image "$node_image" --config "$work/kind-config.yaml" \
  --kubeconfig "$kubeconfig" --retain >&2
docker cp "$cluster-control-plane:/usr/bin/kubectl" "$work/kubectl"
kubectl() { "$work/kubectl" --kubeconfig "$kubeconfig" "$@"; }

step "bridge CNI on each node (kindnetd is not available without a registry)"
# Each node bridges its own pod range (the podCIDR the controller-manager gave it) and routes
# the other nodes' ranges to them over kind's network.
mapfile -t nodes < <(kind get nodes --name "$cluster")
declare -A cidr ip
for n in "${nodes[@]}"; do
  for _ in $(seq 1 60); do
    cidr[$n]=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
    [[ -n "${cidr[$n]}" ]] && break
    sleep 1
  done
  [[ -n "${cidr[$n]}" ]] || { echo "[kind] node $n has no podCIDR" >&2; exit 1; }
  ip[$n]=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$n")
done
for n in "${nodes[@]}"; do
  sed "s|@POD_CIDR@|${cidr[$n]}|" "$here/node/cni.conflist" |
    docker exec -i "$n" sh -c 'cat > /etc/cni/net.d/10-ec2tl-bridge.conflist'
  for other in "${nodes[@]}"; do
    [[ $other == "$n" ]] || docker exec "$n" ip route replace "${cidr[$other]}" via "${ip[$other]}"
  done
done
kubectl wait --for=condition=Ready nodes --all --timeout=120s >&2
kubectl -n kube-system rollout status deploy/coredns --timeout=120s >&2
kubectl -n kube-system rollout status ds/kube-proxy --timeout=120s >&2

step "images into the nodes, mock-ec2 in the cluster"
kind load docker-image --name "$cluster" ec2-topology-labeler:e2e mock-ec2:e2e >&2
kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >&2
kubectl apply -f "$here/mock-ec2.yaml" >&2
kubectl -n "$namespace" rollout status deploy/mock-ec2 --timeout=120s >&2
mock_url="http://127.0.0.1:$mock_port"
for _ in $(seq 1 100); do
  curl -fsS "$mock_url/_admin/stats" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "$mock_url/_admin/stats" >/dev/null

export E2E_KUBECONFIG="$kubeconfig" E2E_MOCK_EC2_URL="$mock_url" E2E_KUBECTL="$work/kubectl" \
  E2E_KIND_VALUES="$here/values.yaml" E2E_REPO_ROOT="$root"
cd "$root"
if [[ ${E2E_KIND_ONLY:-} == creds ]]; then
  # make kind-eks-credentials (docs/install-eks.md): only the credentials phases.
  step "tests: credentials as EKS gives them (IRSA, Pod Identity)"
  cargo test --workspace --locked --test kind -- creds::
  step "done"
  exit 0
fi
step "tests: install"
cargo test --workspace --locked --test kind -- install::
step "tests: the shared e2e suite, against the installed chart"
cargo test --workspace --locked --test e2e
step "tests: operations"
cargo test --workspace --locked --test kind -- ops::
step "tests: credentials as EKS gives them (IRSA, Pod Identity)"
cargo test --workspace --locked --test kind -- creds::
step "done"
