#!/usr/bin/env bash
# Container images without Docker's build machinery: a static musl binary from cargo, placed
# FROM scratch by e2e/image/Containerfile (the last stage of the Dockerfile: CA bundle, user
# 65532, entrypoint /app); with --dev, the host's dev build and its shared libraries instead.
#
#   e2e/image/build.sh [--dev] [--docker] [PACKAGE=TAG ...]
#     default: ec2-topology-labeler=ec2-topology-labeler:local, release profile, buildah (vfs)
#     --dev     the dev build `make build` makes (the kind suite's mock-ec2: no second build of
#               every crate for another target): the host's binary with the shared libraries
#               `ldd` names, copied to the same paths
#     --docker  build into the Docker engine (where `kind load` takes images from)
#   e.g. e2e/image/build.sh --dev --docker ec2-topology-labeler=ec2-topology-labeler:e2e mock-ec2=mock-ec2:e2e
#
# Needs: the rustup target x86_64-unknown-linux-musl (added here), musl-tools (apt), and buildah
# or a Docker engine; with --dev, only the Docker engine.
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

if [[ $profile == dev ]]; then
  # The build `make build` made (a no-op when it is fresh: the same command, the same features).
  target_dir=${CARGO_TARGET_DIR:-$cache/target}
  CARGO_TARGET_DIR="$target_dir" cargo build --workspace --all-targets --locked >&2
  [[ $engine == docker ]] || { echo "--dev images are built with --docker" >&2; exit 2; }
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  for spec in "${images[@]}"; do
    bin=${spec%%=*} tag=${spec#*=}
    exe="$target_dir/debug/$bin"
    rm -rf "${ctx:?}"/*
    cp /etc/ssl/certs/ca-certificates.crt "$ctx/"
    strip -o "$ctx/app" "$exe"
    # The dynamic loader and each library at the path the binary asks for, and glibc's name
    # service modules where they are not built into libc (before 2.34): DNS names in a pod.
    linked=$(ldd "$exe")
    if grep -q 'not found' <<<"$linked"; then
      echo "$exe links a library this machine lacks: $linked" >&2
      exit 1
    fi
    libs=$(grep -o '/[^ ]*' <<<"$linked" | sort -u)
    libc_dir=$(dirname "$(grep -o '/[^ ]*/libc\.so\.6' <<<"$linked" | head -1)")
    for nss in libnss_files.so.2 libnss_dns.so.2 libresolv.so.2; do
      [[ -e $libc_dir/$nss ]] && libs+=$'\n'"$libc_dir/$nss"
    done
    for lib in $libs; do
      mkdir -p "$ctx/rootfs$(dirname "$lib")"
      cp -L "$lib" "$ctx/rootfs$lib"
    done
    printf 'FROM scratch\nCOPY rootfs/ /\n' >"$ctx/Containerfile"
    sed -n '/^COPY ca-certificates/,$p' "$root/e2e/image/Containerfile" >>"$ctx/Containerfile"
    docker build --quiet -t "$tag" -f "$ctx/Containerfile" "$ctx" >/dev/null
    # It starts, as the image's user, with nothing but what the image holds.
    docker run --rm --network none "$tag" --help >/dev/null ||
      { echo "$tag does not start" >&2; exit 1; }
    echo "$tag: $(docker image inspect -f '{{.Size}}' "$tag" | awk '{ printf "%.1f MB", $1 / 1e6 }') (dev build, glibc)" >&2
  done
  exit 0
fi

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
target_dir="$cache/target-release" out_dir=release flags=(--release)
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
