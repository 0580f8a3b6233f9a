#!/usr/bin/env bash
# rust-toolchain.toml pins the toolchain by version. On a machine whose rustup has exactly that
# version installed, but only under the name `stable` (and no way to reach rustup's server), the
# pinned name is made to point at it, so that no cargo call tries a download. Anywhere else this
# does nothing and rustup installs the pinned toolchain as usual. Run by the Makefile (each make).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v rustup >/dev/null 2>&1 || exit 0
want=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
[ -n "$want" ] || exit 0
rustup toolchain list 2>/dev/null | grep -q "^$want-" && exit 0
have=$(RUSTUP_TOOLCHAIN=stable rustc --version 2>/dev/null | awk '{print $2}') || exit 0
[ "$have" = "$want" ] || exit 0
host=$(RUSTUP_TOOLCHAIN=stable rustc -vV | sed -n 's/^host: //p')
sysroot=$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot)
ln -sfn "$sysroot" "${RUSTUP_HOME:-$HOME/.rustup}/toolchains/$want-$host"
echo "rust-toolchain.toml: $want is this machine's stable toolchain; linked it by name" >&2
