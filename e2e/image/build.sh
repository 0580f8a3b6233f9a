#!/usr/bin/env bash
# Build the controller image without a Docker engine: a static musl release binary (cargo),
# then the Dockerfile's final stage with buildah (Debian package), FROM scratch, offline.
#   e2e/image/build.sh [tag]      (default ec2-topology-labeler:local)
# Needs: rustup target x86_64-unknown-linux-musl, musl-tools, buildah.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=${1:-ec2-topology-labeler:local}
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
target=x86_64-unknown-linux-musl
for tool in buildah musl-gcc; do
  command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install buildah musl-tools)" >&2; exit 1; }
done
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
CARGO_TARGET_DIR="$cache/target-release" cargo build --release --locked --target "$target" --bin ec2-topology-labeler
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$cache/target-release/$target/release/ec2-topology-labeler" "$ctx/app"
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
buildah --storage-driver vfs bud --isolation chroot -t "$tag" -f "$root/e2e/image/Containerfile" "$ctx" >&2
buildah --storage-driver vfs images "$tag"
