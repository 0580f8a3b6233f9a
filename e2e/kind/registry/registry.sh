#!/usr/bin/env bash
# The OCI registry the kind suite releases into and installs from: CNCF Distribution (main.go,
# pinned in go.mod), built static from the Go module proxy, run as the container ec2tl-registry
# FROM scratch. This machine pushes to it on loopback (127.0.0.1:5001, so `localhost:5001/...`
# names every image and chart); the kind nodes' containerd pulls from it by its container name
# on the kind networks (run.sh gives containerd that mirror). It answers nothing else.
#
#   registry.sh start NETWORK...   build if needed, start (or keep) it on these Docker networks
#   registry.sh stop               remove the container (and what was pushed to it)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
name=ec2tl-registry
port=5001
log() { echo "[registry] $*" >&2; }

case "${1:-}" in
  stop)
    docker rm -f "$name" >/dev/null 2>&1 || true
    exit 0
    ;;
  start) shift ;;
  *) echo "usage: $0 start NETWORK... | stop" >&2; exit 2 ;;
esac
(($#)) || { echo "usage: $0 start NETWORK..." >&2; exit 2; }

stamp=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" "$here/config.yml" "$here/Containerfile" "$here/registry.sh" |
  sha256sum | cut -c1-12)
image="ec2tl-registry:$stamp"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  out="$cache/kind/registry-$stamp"
  if [[ ! -x "$out/registry" ]]; then
    log "building CNCF Distribution $(awk '$1 == "require" && $2 ~ /distribution/ { print $3 }' "$here/go.mod") (cold: ~1 min)"
    (cd "$here" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.partial/registry" .)
    rm -rf "$out" && mv "$out.partial" "$out"
  fi
  ctx=$(mktemp -d)
  cp "$out/registry" "$here/config.yml" "$ctx/"
  docker build --quiet -t "$image" -f "$here/Containerfile" "$ctx" >/dev/null
  rm -rf "$ctx"
fi

running=$(docker inspect -f '{{.State.Running}} {{.Config.Image}}' "$name" 2>/dev/null || true)
if [[ $running != "true $image" ]]; then
  docker rm -f "$name" >/dev/null 2>&1 || true
  docker run -d --name "$name" --pull=never --restart=no --network "$1" \
    -p "127.0.0.1:$port:5000" "$image" >/dev/null
fi
shift
for network in "$@"; do
  docker network inspect -f '{{range .Containers}}{{.Name}} {{end}}' "$network" | grep -qw "$name" ||
    docker network connect "$network" "$name"
done
for _ in $(seq 1 50); do
  curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && { log "answering at localhost:$port"; exit 0; }
  sleep 0.2
done
docker logs "$name" >&2 || true
log "the registry does not answer at 127.0.0.1:$port"
exit 1
