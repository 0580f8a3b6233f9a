#!/usr/bin/env bash
# Container images without Docker's build machinery: a static musl binary from cargo, placed
# FROM scratch by e2e/image/Containerfile (the last stage of the Dockerfile: CA bundle, user
# 65532, entrypoint /app).
#
#   e2e/image/build.sh [--dev] [--docker] [PACKAGE=TAG ...]
#     default: ec2-topology-labeler=ec2-topology-labeler:local, release profile, buildah (vfs)
#     --dev     the dev profile (the kind suite: no second optimised build of every crate in CI)
#     --docker  build into the Docker engine (where `kind load` takes images from)
#   e.g. e2e/image/build.sh --dev --docker ec2-topology-labeler=ec2-topology-labeler:e2e mock-ec2=mock-ec2:e2e
#
# Needs: the rustup target x86_64-unknown-linux-musl (added here), musl-tools (apt), and buildah
# or a Docker engine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
target=x86_64-unknown-linux-musl
profile=release engine=buildah
images=()
for arg in "$@"; do
  case "$arg" in
    --dev) profile=dev ;;
    --docker) engine=docker ;;
    *=*) images+=("$arg") ;;
    *) echo "usage: $0 [--dev] [--docker] [PACKAGE=TAG ...]" >&2; exit 2 ;;
  esac
done
((${#images[@]})) || images=(ec2-topology-labeler=ec2-topology-labeler:local)

command -v musl-gcc >/dev/null || {
  echo "installing musl-tools (apt)" >&2
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  DEBIAN_FRONTEND=noninteractive flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends musl-tools >&2
}
[[ $engine == docker ]] || command -v buildah >/dev/null ||
  { echo "buildah is required (apt-get install buildah), or pass --docker" >&2; exit 1; }
rustup target list --installed | grep -qx "$target" || rustup target add "$target" >&2

# One cargo invocation for every package: their shared dependencies are built once.
# The release profile has its own target directory (its artifacts never mix with the tests').
if [[ $profile == release ]]; then
  target_dir="$cache/target-release" out_dir=release flags=(--release)
else
  # Its own directory too: CI builds it while `cargo test` holds the test target directory.
  target_dir="$cache/target-musl" out_dir=debug flags=()
fi
packages=()
for spec in "${images[@]}"; do packages+=(--bin "${spec%%=*}"); done
CARGO_TARGET_DIR="$target_dir" cargo build "${flags[@]}" --locked --target "$target" --workspace "${packages[@]}" >&2

ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
for spec in "${images[@]}"; do
  bin=${spec%%=*} tag=${spec#*=}
  # Symbols and debug information have no use in the container.
  strip -o "$ctx/app" "$target_dir/$target/$out_dir/$bin"
  if [[ $engine == docker ]]; then
    docker build --quiet -t "$tag" -f "$root/e2e/image/Containerfile" "$ctx" >/dev/null
    echo "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%.1f MB", $1 / 1e6 }')" >&2
  else
    buildah --storage-driver vfs bud --isolation chroot -t "$tag" -f "$root/e2e/image/Containerfile" "$ctx" >&2
    buildah --storage-driver vfs images "$tag" >&2
  fi
done
