#!/usr/bin/env bash
# The real slurmctld for the tests that judge our Slurm files (crates/core/tests/slurmctld.rs):
#   1. Debian's slurmctld, slurm-client and munge on this machine (apt; 22.05 on bookworm):
#      topology.conf, the tree plugin;
#   2. a Debian sid root (debootstrap, minbase) with sid's slurmctld, slurm-client and munge
#      (26.05 when written): topology.yaml needs Slurm 25.05 or later, which no stable Debian
#      serves. Its libraries need sid's glibc, so the tests run it in that root (chroot, in a
#      mount and PID namespace of its own). Cached under $EC2TL_CACHE/slurm/ by a hash of its
#      recipe; sid moves, so a cold build may bring a newer Slurm (the tests print the version).
#
#   e2e/slurm/install.sh     idempotent; prints nothing on stdout; needs root (apt, chroot)
set -euo pipefail

cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/slurm
mkdir -p "$cache"
log() { echo "[slurm] $*" >&2; }

need=()
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v scontrol >/dev/null || need+=(slurm-client)
command -v munged >/dev/null || need+=(munge)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v unshare >/dev/null || need+=(util-linux)
if ((${#need[@]})); then
  log "installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  # Debian starts munged and slurmctld from their maintainer scripts where it can; the tests
  # start their own. Without a policy of the machine's, deny those starts for this install.
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >&2
fi

packages=slurmctld,slurm-client,munge
# What the root is built from (change the recipe below, change this line too).
recipe="debootstrap --variant=minbase sid $packages"
key=$(echo "$recipe" | sha256sum | cut -c1-16)
root=$cache/sid-$key
if [[ ! -x $root/root/usr/sbin/slurmctld ]]; then
  log "building a Debian sid root with $packages (debootstrap, a few minutes)"
  rm -rf "$root.tmp"
  mkdir -p "$root.tmp"
  debootstrap --variant=minbase --include="$packages" sid "$root.tmp/root" \
    http://deb.debian.org/debian >"$root.tmp/debootstrap.log" 2>&1 ||
    { tail -20 "$root.tmp/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"
  mv "$root.tmp" "$root"
fi
# The tests find the current root here.
ln -sfn "$root/root" "$cache/sid-root"
log "host: $(slurmctld -V); sid root: $(chroot "$root/root" slurmctld -V)"
