# shellcheck shell=bash
# Sourced by hack/release.sh and hack/shipped-binary.sh: the pinned cross-compiling tools the
# release builds the controller with (cargo-zigbuild and zig from PyPI, cached by version) and
# the target directory they build into. Defines `zigbuild_tools` (installs what is missing and
# sets $zigbuild_venv) and $zigbuild_target_dir.
ZIGBUILD_VERSION=0.24.1
ZIGLANG_VERSION=0.15.2
zigbuild_cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
# Its own target directory: zig is these targets' C compiler here, musl-gcc in e2e/image.
zigbuild_target_dir="$zigbuild_cache/target-dist"
zigbuild_venv="$zigbuild_cache/release-tools/zigbuild-$ZIGBUILD_VERSION-zig-$ZIGLANG_VERSION"

# zigbuild_tools TARGET...: the rustup targets and the pinned cargo-zigbuild + zig.
zigbuild_tools() {
  local t
  for t in "$@"; do
    rustup target list --installed | grep -qx "$t" || rustup target add "$t" >&2
  done
  if [[ ! -x "$zigbuild_venv/bin/cargo-zigbuild" ]]; then
    rm -rf "$zigbuild_venv"
    python3 -m venv "$zigbuild_venv"
    "$zigbuild_venv/bin/pip" install --quiet --disable-pip-version-check \
      "cargo-zigbuild==$ZIGBUILD_VERSION" "ziglang==$ZIGLANG_VERSION" >&2
  fi
}

# zigbuild PROFILE TARGET...: the controller for each target, as the release builds it.
zigbuild() {
  local profile=$1
  shift
  PATH="$zigbuild_venv/bin:$PATH" CARGO_TARGET_DIR="$zigbuild_target_dir" cargo zigbuild --profile "$profile" --locked \
    --bin ec2-topology-labeler "${@/#/--target=}" >&2
}
