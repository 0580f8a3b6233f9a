#!/usr/bin/env bash
# The e2e suite on kind clusters, from nothing, on a machine with no outside registry:
#   1. host.sh: Docker engine, the egress guard on the suite's two Docker networks (before any
#      container), those networks, the runc wrapper where privileged containers need it;
#   2. the kind CLI and the node image, built locally (node-image.sh), cached by their inputs;
#   3. a real OCI registry on this machine (registry/registry.sh: CNCF Distribution, on the kind
#      networks and on loopback as localhost:5001), and `make release` into it: the controller
#      image for linux/amd64 and linux/arm64 (the ci-dist profile unless RELEASE_PROFILE says
#      otherwise), the chart pinning it by digest, the SBOM, all
#      signed with a key made for the run (mock-ec2's image, from the dev build, is pushed
#      beside them after the preparation, once `make build` has run);
#   4. a cluster of a control plane and a worker whose kubelets have EC2 providerIDs, a bridge
#      CNI, mock-ec2 in the cluster; containerd pulls localhost:5001/... from the registry and
#      nothing from anywhere else;
#   5. the tests: `release::` (what was pushed), `install::` (`helm install oci://...` as the
#      README says), the shared e2e suite against the installed chart, `ops::` (leader pod
#      deleted, drain, upgrade, uninstall), `creds::` (IRSA and EKS Pod Identity against the
#      stand-ins; only these with E2E_KIND_ONLY=creds);
#   6. an IPv6 single-stack cluster (its own network), the same release installed from the
#      registry: `ipv6::` (probes, labels, helm test).
#
#   e2e/kind/run.sh            all of it; the clusters are deleted at the end
#   e2e/kind/run.sh --prepare  only steps 1-3 (CI runs them in the background, at low priority,
#                              while the other suites run)
#   e2e/kind/run.sh --keep     leave the (last) cluster and the registry running (the
#                              kubeconfig is printed)
#   e2e/kind/run.sh --down     make kind-down: delete the clusters and the registry, and undo
#                              what host.sh changed on this machine (rules, networks, namespace)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$cache/target}
cluster4=ec2tl-e2e
cluster6=ec2tl-e2e6
network4=ec2tl-kind
network6=ec2tl-kind6
registry=localhost:5001
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

kind_bin="$cache/kind/cli-$(cat "$here/tools/go.mod" "$here/tools/go.sum" | sha256sum | cut -c1-12)"
kind() { "$kind_bin/kind" "$@"; }

if [[ "${1:-}" == "--down" ]]; then
  if [[ -x "$kind_bin/kind" ]]; then
    for c in "$cluster4" "$cluster6"; do kind delete cluster --name "$c" >&2; done
  fi
  command -v docker >/dev/null && "$here/registry/registry.sh" stop
  "$here/host.sh" --remove
  exit 0
fi

step "host: Docker engine, egress guard, networks, runc wrapper if needed"
"$here/host.sh"

step "kind CLI"
if [[ ! -x "$kind_bin/kind" ]]; then
  # -N -l: no optimiser or inliner for a test tool whose speed no test measures (a cold
  # build takes less CPU: docs/development.md, "Building").
  (cd "$here/tools" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -gcflags="all=-N -l" -ldflags "-s -w" \
    -o "$kind_bin.partial/kind" sigs.k8s.io/kind)
  rm -rf "$kind_bin" && mv "$kind_bin.partial" "$kind_bin"
fi

# First: its debootstrap is mostly downloading. It needs the control plane `make controlplane`
# builds (CI runs this beside it: whichever comes first builds it, the other waits for it).
step "node image (cached by its inputs; cold: debootstrap + Go builds)"
node_image=$("$here/node-image.sh")

step "registry (CNCF Distribution) on $network4 and $network6, as $registry here"
"$here/registry/registry.sh" start "$network4" "$network6"

step "make release into it (linux/amd64 + linux/arm64, chart by digest, SBOM, signatures; ${RELEASE_PROFILE:=ci-dist} profile)"
# A signing key made for this machine's runs (no password): the tests verify with its public key.
keys="$cache/kind/cosign"
dist="$cache/kind/dist"
cosign="$("$root/e2e/tools/cosign/build.sh")/cosign"
if [[ ! -s "$keys/cosign.key" ]]; then
  mkdir -p "$keys"
  (cd "$keys" && COSIGN_PASSWORD="" "$cosign" generate-key-pair >/dev/null)
fi
# The README's release block (`<!-- doc-test: kind-release -->`: `make release` into REGISTRY),
# run as written with this registry as REGISTRY. The ci-dist profile unless told otherwise: the
# same code and targets as a release, without the optimiser's CPU time (a cold release build is
# over 20 minutes here); RELEASE_PROFILE=release runs the suite on exactly what a release ships.
# Signed with the run's key (the README's reader signs or not; the suite checks signatures).
readme_block() {
  awk -v mark="<!-- doc-test: $1 -->" '
    index($0, mark) { found = 1; next }
    found && /^[ \t]*```/ { if (inside) exit; inside = 1; match($0, /^[ \t]*/); indent = RLENGTH; next }
    inside { print substr($0, indent + 1) }
  ' "$root/README.md"
}
release_block=$(readme_block kind-release)
[[ -n $release_block ]] || { echo "README.md has no kind-release block" >&2; exit 1; }
(cd "$root" && RELEASE_PROFILE=$RELEASE_PROFILE REGISTRY=$registry DIST=$dist COSIGN_KEY="$keys/cosign.key" COSIGN_PASSWORD="" \
  bash -e -o pipefail -c "$release_block") >/dev/null

if [[ "${1:-}" == "--prepare" ]]; then
  step "prepared"
  exit 0
fi

# From the dev build the tests run (`make kind` builds it first; CI's preparation runs beside
# that build, so this step is here, after it).
step "mock-ec2 image (the dev build), pushed to the registry"
"$root/e2e/image/build.sh" --dev --docker mock-ec2=$registry/mock-ec2:e2e
docker push --quiet "$registry/mock-ec2:e2e" >/dev/null

rm -rf "$work"
mkdir -p "$work"
release=$(cat "$dist/release.json")
version=$(jq -r .version <<<"$release")
current=""
cleanup() {
  local rc=$?
  if [[ -n $current ]]; then
    if ((rc != 0)); then
      kind export logs "$work/logs-$current" --name "$current" >/dev/null 2>&1 &&
        echo "[kind] failed; cluster logs in $work/logs-$current" >&2
    fi
    if [[ $keep == false ]]; then
      kind delete cluster --name "$current" >/dev/null 2>&1 || true
    else
      echo "[kind] cluster kept: KUBECONFIG=$work/$current/kubeconfig" >&2
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT

# cluster_up NAME ipv4|ipv6: the cluster on its network, CNI, mock-ec2; exports what the tests read.
cluster_up() {
  local name=$1 family=$2 network dir mock_port default_route
  dir="$work/$name"
  mkdir -p "$dir"
  mock_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if [[ $family == ipv4 ]]; then
    network=$network4 default_route=0.0.0.0/0
    sed "s/@MOCK_PORT@/$mock_port/" "$here/kind-config.yaml" >"$dir/kind-config.yaml"
  else
    network=$network6 default_route=::/0
    # The same nodes, IPv6 only: node, pod and service addresses. mock-ec2 runs on the host
    # network of the control-plane node (below), so this machine reaches it over the node's
    # IPv4 address as before while the controller reaches it over IPv6.
    sed -e "s/@MOCK_PORT@/$mock_port/" -e 's/ipFamily: ipv4/ipFamily: ipv6/' \
      -e 's/apiServerAddress: 127.0.0.1/apiServerAddress: "::1"/' \
      -e 's/containerPort: 30080/containerPort: 8080/' "$here/kind-config.yaml" >"$dir/kind-config.yaml"
  fi
  kind delete cluster --name "$name" >/dev/null 2>&1 || true
  current=$name
  KIND_EXPERIMENTAL_DOCKER_NETWORK=$network kind create cluster --name "$name" --image "$node_image" \
    --config "$dir/kind-config.yaml" --kubeconfig "$dir/kubeconfig" --retain 2>&1 |
    grep -v 'Overriding docker network' >&2
  docker cp "$name-control-plane:/usr/bin/kubectl" "$dir/kubectl"
  kubectl() { "$dir/kubectl" --kubeconfig "$dir/kubeconfig" "$@"; }

  # kindnetd is not available without its image: a bridge CNI on each node. Each node bridges
  # its own pod range (the podCIDR the controller-manager gave it) and routes the other nodes'
  # ranges to them over the kind network.
  local nodes n other
  mapfile -t nodes < <(kind get nodes --name "$name")
  declare -A cidr ip
  for n in "${nodes[@]}"; do
    for _ in $(seq 1 60); do
      cidr[$n]=$(kubectl get node "$n" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
      [[ -n "${cidr[$n]}" ]] && break
      sleep 1
    done
    [[ -n "${cidr[$n]}" ]] || { echo "[kind] node $n has no podCIDR" >&2; exit 1; }
    if [[ $family == ipv4 ]]; then
      ip[$n]=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$network\").IPAddress}}" "$n")
    else
      ip[$n]=$(docker inspect -f "{{(index .NetworkSettings.Networks \"$network\").GlobalIPv6Address}}" "$n")
    fi
  done
  for n in "${nodes[@]}"; do
    sed -e "s|@POD_CIDR@|${cidr[$n]}|" -e "s|0.0.0.0/0|$default_route|" "$here/node/cni.conflist" |
      docker exec -i "$n" sh -c 'cat > /etc/cni/net.d/10-ec2tl-bridge.conflist'
    for other in "${nodes[@]}"; do
      [[ $other == "$n" ]] || docker exec "$n" ip route replace "${cidr[$other]}" via "${ip[$other]}"
    done
  done
  kubectl wait --for=condition=Ready nodes --all --timeout=120s >&2
  kubectl -n kube-system rollout status deploy/coredns --timeout=120s >&2
  kubectl -n kube-system rollout status ds/kube-proxy --timeout=120s >&2

  kubectl create namespace "$namespace" --dry-run=client -o yaml | kubectl apply -f - >&2
  if [[ $family == ipv4 ]]; then
    kubectl apply -f "$here/mock-ec2.yaml" >&2
  else
    sed -e 's|--listen=0.0.0.0:8080|--listen=[::]:8080|' \
      -e 's|      nodeSelector:|      hostNetwork: true\n      nodeSelector:|' "$here/mock-ec2.yaml" | kubectl apply -f - >&2
  fi
  kubectl -n "$namespace" rollout status deploy/mock-ec2 --timeout=120s >&2
  local mock_url="http://127.0.0.1:$mock_port"
  for _ in $(seq 1 100); do
    curl -fsS "$mock_url/_admin/stats" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fsS "$mock_url/_admin/stats" >/dev/null
  export E2E_KUBECONFIG="$dir/kubeconfig" E2E_MOCK_EC2_URL="$mock_url" E2E_KUBECTL="$dir/kubectl" \
    E2E_KIND_FAMILY=$family
  unset -f kubectl
}

cluster_down() {
  kind delete cluster --name "$1" >/dev/null 2>&1 || true
  current=""
}

# What every phase reads: the release in the registry (helm install oci://...), the kind values.
export E2E_KIND_VALUES="$here/values.yaml" E2E_REPO_ROOT="$root" E2E_KIND_RELEASE="$dist/release.json" \
  E2E_KIND_COSIGN="$cosign" E2E_KIND_COSIGN_PUB="$keys/cosign.pub"
cd "$root"

step "IPv4 cluster"
cluster_up "$cluster4" ipv4
if [[ ${E2E_KIND_ONLY:-} == creds ]]; then
  # make kind-eks-credentials (docs/install-eks.md): only the credentials phases.
  step "tests: credentials as EKS gives them (IRSA, Pod Identity)"
  cargo test --workspace --locked --test kind -- creds::
  step "done"
  exit 0
fi
step "tests: the release in the registry ($version)"
cargo test --workspace --locked --test kind -- release::
step "tests: install"
cargo test --workspace --locked --test kind -- install::
step "tests: the shared e2e suite, against the installed chart"
cargo test --workspace --locked --test e2e
step "tests: operations"
cargo test --workspace --locked --test kind -- ops::
step "tests: credentials as EKS gives them (IRSA, Pod Identity)"
cargo test --workspace --locked --test kind -- creds::
cluster_down "$cluster4"

step "IPv6 single-stack cluster"
cluster_up "$cluster6" ipv6
step "tests: IPv6 (the release from the registry: probes, labels, helm test)"
cargo test --workspace --locked --test kind -- ipv6::
if [[ $keep == false ]]; then
  cluster_down "$cluster6"
  "$here/registry/registry.sh" stop
fi
step "done"
