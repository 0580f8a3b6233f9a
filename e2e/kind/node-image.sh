#!/usr/bin/env bash
# Build the kind node image locally, as `kind build node-image` would, with no registry:
#   - a Debian bookworm root filesystem from debootstrap (systemd, containerd, runc, iptables,
#     CNI plugins…), cached as a tarball keyed by its package list;
#   - kind's base-image files and entrypoint, from the pinned sigs.k8s.io/kind module;
#   - kubelet, kubeadm, kubectl and the control-plane binaries, static, from the same pinned
#     k8s.io/kubernetes as our bare control plane (e2e/controlplane: kube-apiserver and etcd are
#     that very build); a CoreDNS with only the plugins kubeadm's Corefile uses; our own pause;
#   - each component as an image under the exact name `kubeadm config images list` prints,
#     preloaded into the node's containerd.
# The result is tagged ec2tl-kind-node:<hash of every input>: a warm machine reuses it, a change
# of any input builds a new one. Prints the image name on stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}
log() { echo "[node-image] $*" >&2; }

kind_version=$(awk '$1 == "sigs.k8s.io/kind" { print $2; exit }' "$here/tools/go.mod")
cp_dir="$root/e2e/controlplane"
k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$cp_dir/go.mod")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
packages=systemd,systemd-sysv,dbus,containerd,runc,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,socat,ca-certificates,containernetworking-plugins,procps,libseccomp2,jq

stamp=$(
  {
    echo "$suite $packages $kind_version"
    cat "$here/node-image.sh" "$cp_dir/go.mod" "$cp_dir/go.sum" "$cp_dir/build.sh"
    find "$here/images" "$here/node" -type f | sort | xargs cat
  } | sha256sum | cut -c1-12
)
image="ec2tl-kind-node:$stamp"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
start=$(date +%s)
work="$cache/kind/build-$stamp"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# --- 1. root filesystem (debootstrap, cached) ---------------------------------------------------
rootfs_tar="$cache/kind/rootfs-$(echo "$suite $packages $mirror" | sha256sum | cut -c1-12).tar"
if [[ ! -s "$rootfs_tar" ]]; then
  log "debootstrap $suite (cold: ~3 min)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" --numeric-owner -cf "$rootfs_tar.partial" .
  mv "$rootfs_tar.partial" "$rootfs_tar"
  rm -rf "$work/rootfs"
fi

# --- 2. binaries (Go, static; cached with the control plane's pins) ----------------------------
cp_bin=$("$cp_dir/build.sh")
bin="$cache/kind/bin-$(cat "$cp_dir/go.mod" "$cp_dir/go.sum" "$here/images/coredns/go.mod" "$here/images/coredns/go.sum" "$here/images/coredns/main.go" "$here/images/pause/pause.c" | sha256sum | cut -c1-12)"
if [[ ! -x "$bin/coredns" ]]; then
  mkdir -p "$bin.partial"
  ldflags=$("$cp_dir/build.sh" --print-ldflags)
  for cmd in kubeadm kubelet kubectl kube-controller-manager kube-scheduler kube-proxy; do
    log "building $cmd $k8s_version"
    (cd "$cp_dir" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" \
      -o "$bin.partial/$cmd" "k8s.io/kubernetes/cmd/$cmd")
  done
  log "building coredns"
  (cd "$here/images/coredns" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" \
    -o "$bin.partial/coredns" .)
  gcc -static -Os -o "$bin.partial/pause" "$here/images/pause/pause.c"
  rm -rf "$bin"
  mv "$bin.partial" "$bin"
fi

# --- 3. component images, named as kubeadm expects ---------------------------------------------
registry=registry.k8s.io
# What this kubeadm will ask for (also the pause tag kubeadm prints; containerd's sandbox image
# is set to the same in node/containerd-config.toml).
mapfile -t wanted < <("$bin/kubeadm" config images list --kubernetes-version "$k8s_version")
tag_of() { printf '%s\n' "${wanted[@]}" | grep "^$registry/$1:" | head -1; }

# A single-binary image: the binary at /usr/local/bin/<name> (kubeadm's static Pod manifests
# run it by name), an entrypoint for those run without a command (CoreDNS, pause).
single_binary_image() { # name tag binary [entrypoint]
  local dir="$work/img-$1"
  mkdir -p "$dir/usr/local/bin" "$dir/etc/ssl/certs" "$dir/tmp"
  chmod 1777 "$dir/tmp"
  cp "$3" "$dir/usr/local/bin/$1"
  cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
  echo 'nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin' >"$dir/etc/passwd"
  local changes=(--change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin')
  [[ -n "${4:-}" ]] && changes+=(--change "ENTRYPOINT [\"$4\"]")
  tar -C "$dir" --numeric-owner --owner=0 --group=0 -c . | docker import "${changes[@]}" - "$2" >/dev/null
}

# kube-proxy needs iptables: the binaries and every library they load, copied from the node's
# own root filesystem (so the image speaks the same iptables as the node), no shell tools else.
kube_proxy_image() { # tag
  local rootfs="$work/rootfs" dir="$work/img-kube-proxy"
  mkdir -p "$dir/usr/local/bin" "$dir/usr/sbin" "$dir/run" "$dir/tmp" "$dir/etc"
  cp "$bin/kube-proxy" "$dir/usr/local/bin/"
  local files=(/usr/sbin/xtables-legacy-multi /usr/sbin/xtables-nft-multi /usr/sbin/conntrack
    /bin/sh /bin/dash /usr/bin/basename /bin/ln /bin/grep)
  local modules
  mapfile -t modules < <(cd "$rootfs" && find usr/lib/x86_64-linux-gnu/xtables -name '*.so' | sed 's|^|/|')
  files+=("${modules[@]}")
  local f lib
  for f in "${files[@]}"; do
    mkdir -p "$dir$(dirname "$f")"
    cp -a "$rootfs$f" "$dir$f"
    # The shared libraries each file needs, resolved inside the node's root filesystem.
    for lib in $(chroot "$rootfs" ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
      [[ -e "$dir$lib" ]] && continue
      mkdir -p "$dir$(dirname "$lib")"
      cp -aL "$rootfs$lib" "$dir$lib"
    done
  done
  ln -sf dash "$dir/bin/sh"
  cp "$here/images/kube-proxy/iptables-wrapper" "$dir/usr/sbin/iptables-wrapper"
  for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf iptables-wrapper "$dir/usr/sbin/$name"
  done
  tar -C "$dir" --numeric-owner --owner=0 --group=0 -c . |
    docker import --change 'ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$1" >/dev/null
}

log "assembling the root filesystem"
mkdir -p "$work/rootfs"
tar -C "$work/rootfs" --numeric-owner -xf "$rootfs_tar"
r="$work/rootfs"

for c in kube-apiserver kube-controller-manager kube-scheduler; do
  if [[ $c == kube-apiserver ]]; then b="$cp_bin/kube-apiserver"; else b="$bin/$c"; fi
  single_binary_image "$c" "$(tag_of "$c")" "$b"
done
single_binary_image etcd "$(tag_of etcd)" "$cp_bin/etcd"
single_binary_image coredns "$(tag_of coredns/coredns)" "$bin/coredns" /usr/local/bin/coredns
single_binary_image pause "$(tag_of pause)" "$bin/pause" /usr/local/bin/pause
kube_proxy_image "$(tag_of kube-proxy)"
for want in "${wanted[@]}"; do
  docker image inspect "$want" >/dev/null || { log "no image for $want"; exit 1; }
done
docker save -o "$work/images.tar" "${wanted[@]}"

# --- 4. the node: kind's base-image files, our configuration, the binaries ---------------------
kind_src=$(cd "$here/tools" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
base="$kind_src/images/base/files"
install -m 0755 "$base"/usr/local/bin/* "$r/usr/local/bin/"
mkdir -p "$r/kind/bin" "$r/etc/systemd/system/kubelet.service.d" "$r/etc/containerd" "$r/etc/kubernetes/manifests" \
  "$r/opt/cni/bin" "$r/etc/cni/net.d"
install -m 0755 "$base"/kind/bin/* "$r/kind/bin/"
install -m 0644 "$base"/etc/sysctl.d/* "$r/etc/sysctl.d/"
install -m 0644 "$base"/etc/default/kubelet "$r/etc/default/kubelet"
install -m 0644 "$base"/etc/crictl.yaml "$r/etc/crictl.yaml"
for unit in kubelet.service kubelet.slice containerd.service undo-mount-hacks.service; do
  install -m 0644 "$base/etc/systemd/system/$unit" "$r/etc/systemd/system/$unit"
done
install -m 0644 "$base"/etc/systemd/system/kubelet.service.d/* "$r/etc/systemd/system/kubelet.service.d/"
# Debian ships containerd in /usr/bin; kind's unit starts /usr/local/bin/containerd.
ln -sf /usr/bin/containerd "$r/usr/local/bin/containerd"
ln -sf /usr/bin/ctr "$r/usr/local/bin/ctr"
sed "s|@PAUSE_IMAGE@|$(tag_of pause)|" "$here/node/containerd-config.toml" >"$r/etc/containerd/config.toml"
chmod 0755 "$r/kind" "$r/kind/bin"
# Debian's CNI plugins, where kubelet and containerd look for them.
for p in "$r"/usr/lib/cni/*; do ln -sf "/usr/lib/cni/$(basename "$p")" "$r/opt/cni/bin/$(basename "$p")"; done
for b in kubeadm kubelet kubectl; do install -m 0755 "$bin/$b" "$r/usr/bin/$b"; done
echo "$k8s_version" >"$r/kind/version"
# containerd's base OCI spec, as kind's base image makes it: kind's mount hook, no rlimits.
chroot "$r" ctr oci spec |
  jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
  jq 'del(.process.rlimits)' >"$r/etc/containerd/cri-base.json"
# Services, as kind's base image: only what a node needs starts.
find "$r/lib/systemd/system/sysinit.target.wants/" -name "systemd-tmpfiles-setup.service" -delete
rm -f "$r"/lib/systemd/system/multi-user.target.wants/* "$r"/etc/systemd/system/*.wants/* \
  "$r"/lib/systemd/system/local-fs.target.wants/* "$r"/lib/systemd/system/sockets.target.wants/*udev* \
  "$r"/lib/systemd/system/sockets.target.wants/*initctl* "$r"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$r/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$r/sbin/init"
chroot "$r" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
chroot "$r" systemctl mask systemd-binfmt.service >/dev/null 2>&1
# The node's hostname and DNS are set by Docker at run time.
rm -f "$r/etc/hostname"

log "importing the node root filesystem"
stage="ec2tl-kind-node-stage:$stamp"
tar -C "$r" --numeric-owner -c . | docker import - "$stage" >/dev/null
rm -rf "$r"

# --- 5. preload the component images into the node's containerd, as kind does ------------------
log "preloading ${#wanted[@]} images into the node's containerd"
cid=$(docker run -d --pull=never --privileged --network none --entrypoint /bin/sleep \
  -v "$work/images.tar:/images.tar:ro" "$stage" infinity)
cleanup_stage() {
  docker rm -f "$cid" >/dev/null 2>&1 || true
  docker rmi "$stage" "${wanted[@]}" >/dev/null 2>&1 || true
}
trap 'cleanup_stage; rm -rf "$work"' EXIT
docker exec "$cid" bash -c '
  set -e
  containerd >/var/log/containerd-preload.log 2>&1 &
  for _ in $(seq 1 50); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
  ctr --namespace=k8s.io images import --label=io.cri-containerd.pinned=pinned \
    --all-platforms --no-unpack --digests /images.tar >/dev/null
  ctr --namespace=k8s.io images list -q | grep -v "^sha256:" | sort
  kill %1; wait || true
  rm -f /var/log/containerd-preload.log
' >"$work/preloaded.txt"
for want in "${wanted[@]}"; do
  grep -qx "$want" "$work/preloaded.txt" || { log "$want was not preloaded"; cat "$work/preloaded.txt" >&2; exit 1; }
done
# (kind's image also sets STOPSIGNAL SIGRTMIN+3 for systemd; `docker commit` here cannot, and kind
# never stops a node by signal: it removes it with `docker rm -f`.)
docker commit \
  --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' \
  --change 'CMD []' \
  --change 'ENV container=docker' \
  "$cid" "$image" >/dev/null
cleanup_stage
# Node images of earlier inputs are of no more use.
docker images --format '{{.Repository}}:{{.Tag}}' | grep -E '^ec2tl-kind-node(-stage)?:' | grep -vx "$image" |
  xargs -r docker rmi >/dev/null 2>&1 || true
log "built $image in $(( $(date +%s) - start ))s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
echo "$image"
