# shellcheck shell=bash
# Sourced by hack/release.sh and hack/shipped-binary.sh: the pinned cross-compiling tools the
# release builds the controller with (cargo-zigbuild and zig from PyPI, cached by version) and
# the target directory they build into. Defines `zigbuild_tools` (installs what is missing and
# sets $zigbuild_venv) and $zigbuild_target_dir.
#
# Each wheel is checked against its SHA-256 (pip --require-hashes: a wheel that does not match, or
# a platform with no pinned wheel, fails the install). The hashes are PyPI's files for
# manylinux x86_64 and aarch64; a version bump needs new ones:
#   pip download --no-deps --only-binary=:all: [--platform manylinux2014_aarch64] \
#     cargo-zigbuild==V ziglang==V && sha256sum *.whl
ZIGBUILD_VERSION=0.24.1
ZIGBUILD_SHA256=(
  238a1ab54a95053a4eadc34775c81f795a8ad75f80bfed63f3f445f518102375 # manylinux1_x86_64
  07c5e3dcddf208500462ec927c556bb306cca2b533b0abe29446bffb63767b85 # manylinux2014_aarch64
)
ZIGLANG_VERSION=0.15.2
ZIGLANG_SHA256=(
  806316453d1ede7174ed3fefb8e5348154629089c3bb5fe812dfd0e172fac130 # manylinux_2_12_x86_64
  edc0aa60ec964a4cf462d40f68d7de242ddf37fd9a80f2afaee6397059463230 # manylinux_2_17_aarch64
)
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
    local reqs h
    rm -rf "$zigbuild_venv"
    python3 -m venv "$zigbuild_venv"
    reqs="$zigbuild_venv/requirements.txt"
    {
      printf 'cargo-zigbuild==%s' "$ZIGBUILD_VERSION"
      for h in "${ZIGBUILD_SHA256[@]}"; do printf ' --hash=sha256:%s' "$h"; done
      printf '\nziglang==%s' "$ZIGLANG_VERSION"
      for h in "${ZIGLANG_SHA256[@]}"; do printf ' --hash=sha256:%s' "$h"; done
      printf '\n'
    } >"$reqs"
    # Wheels only (no build step runs), every one hashed, nothing unpinned pulled in; pip checks
    # every hash before it installs anything.
    if ! "$zigbuild_venv/bin/pip" install --quiet --disable-pip-version-check \
      --require-hashes --only-binary=:all: --no-deps -r "$reqs" >&2; then
      rm -rf "$zigbuild_venv"
      echo "cargo-zigbuild $ZIGBUILD_VERSION / ziglang $ZIGLANG_VERSION: not installed (no wheel for this platform, or one not matching its SHA-256 in hack/zigbuild.sh)" >&2
      return 1
    fi
  fi
}

# zigbuild PROFILE TARGET...: the controller for each target, as the release builds it.
zigbuild() {
  local profile=$1
  shift
  PATH="$zigbuild_venv/bin:$PATH" CARGO_TARGET_DIR="$zigbuild_target_dir" cargo zigbuild --profile "$profile" --locked \
    --bin ec2-topology-labeler "${@/#/--target=}" >&2
}
