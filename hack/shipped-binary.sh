#!/usr/bin/env bash
# The controller exactly as the image ships it for this machine's architecture (the release
# profile, the static musl target, zig as the C compiler and linker: what hack/release.sh
# builds, in the same target directory), for the benchmarks to measure beside the glibc build.
# Prints the binary's path.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=hack/zigbuild.sh
source "$root/hack/zigbuild.sh"
target="$(uname -m)-unknown-linux-musl"
zigbuild_tools "$target"
zigbuild release "$target"
echo "$zigbuild_target_dir/$target/release/ec2-topology-labeler"
