#!/usr/bin/env bash
# Make this machine able to run kind, safely, from nothing:
#   1. Debian's Docker engine (docker.io) and the tools the kind path needs (apt);
#   2. dockerd running (started here when no engine answers);
#   3. the egress guard, before any container starts: packets forwarded from a container
#      network to anywhere outside the container networks are rejected (DOCKER-USER for IPv4,
#      FORWARD for IPv6). Nothing a container or a pod sends can leave this machine;
#   4. a probe: a privileged container with no network. Only if it fails (a sandbox whose
#      capability bounding set lacks some capability Docker grants privileged containers, e.g.
#      CAP_SYS_RESOURCE) is a runc wrapper installed as dockerd's default runtime: it drops the
#      capabilities outside the bounding set from each container's spec (create/run) and from
#      `runc exec --process` specs. On a normal Docker host nothing changes.
#   5. the guard is checked without sending anything outward: a network namespace on this
#      machine plays "outside" (a veth, a TEST-NET-2 address, a listener) and a container must
#      be refused there.
#
#   e2e/kind/host.sh            idempotent; prints nothing on stdout
#   e2e/kind/host.sh --check    only check the guard (exit 1 when it is missing)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/kind-host
mkdir -p "$state"
log() { echo "[kind-host] $*" >&2; }

# --- the egress guard --------------------------------------------------------------------------
# Container networks are Docker's bridges: docker0 and the user-defined br-*. A packet that
# comes in on one of them and would go out on anything else is leaving the container networks.
guard_rules() {
  local cmd=$1 chain=$2
  for bridge in docker0 'br-+'; do
    # Rejected, not dropped: a client fails at once instead of hanging until its timeout.
    local rule=(-i "$bridge" ! -o "$bridge" -j REJECT)
    $cmd -C "$chain" "${rule[@]}" 2>/dev/null || $cmd -I "$chain" 1 "${rule[@]}"
  done
}

install_guard() {
  # DOCKER-USER is Docker's place for the host's own rules: FORWARD jumps to it first, and
  # dockerd never flushes it (also not on restart).
  iptables -N DOCKER-USER 2>/dev/null || true
  iptables -C FORWARD -j DOCKER-USER 2>/dev/null || iptables -I FORWARD 1 -j DOCKER-USER
  guard_rules iptables DOCKER-USER
  # dockerd (20.10) manages no IPv6 rules; the networks here are IPv4-only, and IPv6 forwarded
  # from a bridge is rejected all the same.
  if command -v ip6tables >/dev/null; then
    guard_rules ip6tables FORWARD
  fi
}

guard_installed() {
  local rules
  rules=$(iptables -S DOCKER-USER 2>/dev/null) || return 1
  grep -q -- '-i docker0 ! -o docker0 -j REJECT' <<<"$rules" &&
    grep -q -- '-i br-+ ! -o br-+ -j REJECT' <<<"$rules"
}

if [[ "${1:-}" == "--check" ]]; then
  guard_installed || { log "the egress guard is NOT installed"; exit 1; }
  log "egress guard installed"
  exit 0
fi

# --- packages ----------------------------------------------------------------------------------
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v iptables >/dev/null || need+=(iptables)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v jq >/dev/null || need+=(jq)
[[ -x /bin/busybox ]] || need+=(busybox-static)
command -v ip >/dev/null || need+=(iproute2)
if ((${#need[@]})); then
  log "installing ${need[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# --- dockerd -----------------------------------------------------------------------------------
docker_up() { timeout 10 docker info >/dev/null 2>&1; }

start_dockerd() {
  log "starting dockerd (log: $state/dockerd.log)"
  # Not through systemd: CI machines and sandboxes often run without it.
  setsid dockerd >>"$state/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 1 60); do
    docker_up && return 0
    sleep 1
  done
  log "dockerd did not come up; last lines of its log:"
  tail -20 "$state/dockerd.log" >&2
  return 1
}

stop_dockerd() {
  local pid
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  [[ -n "$pid" ]] || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 1
  done
}

docker_up || start_dockerd
install_guard
guard_installed || { log "could not install the egress guard; refusing to go on"; exit 1; }

# --- the probe image: busybox, imported from Debian's static build (no pull) --------------------
probe_image=ec2tl-probe:busybox
if ! docker image inspect "$probe_image" >/dev/null 2>&1; then
  root=$(mktemp -d)
  mkdir -p "$root/bin"
  cp /bin/busybox "$root/bin/busybox"
  for applet in sh true nc sleep cat; do ln -s busybox "$root/bin/$applet"; done
  tar -C "$root" -c . | docker import --change 'ENV PATH=/bin' - "$probe_image" >/dev/null
  rm -rf "$root"
fi

probe() {
  docker run --rm --pull=never --privileged --network none "$probe_image" true 2>"$state/probe.err"
}

# --- the runc wrapper, only when a privileged container cannot start ----------------------------
if ! probe; then
  if ! grep -q 'apply caps\|operation not permitted' "$state/probe.err"; then
    log "a privileged container fails for another reason:"
    cat "$state/probe.err" >&2
    exit 1
  fi
  log "privileged containers fail here ($(head -c 200 "$state/probe.err")); installing the runc wrapper"
  real_runc=$(command -v runc)
  # Names of the capabilities in this process's bounding set (what any container here can have).
  bounding=$(awk '/^CapBnd/ { print $2 }' /proc/self/status)
  names=(CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_KILL CAP_SETGID
    CAP_SETUID CAP_SETPCAP CAP_LINUX_IMMUTABLE CAP_NET_BIND_SERVICE CAP_NET_BROADCAST CAP_NET_ADMIN
    CAP_NET_RAW CAP_IPC_LOCK CAP_IPC_OWNER CAP_SYS_MODULE CAP_SYS_RAWIO CAP_SYS_CHROOT CAP_SYS_PTRACE
    CAP_SYS_PACCT CAP_SYS_ADMIN CAP_SYS_BOOT CAP_SYS_NICE CAP_SYS_RESOURCE CAP_SYS_TIME
    CAP_SYS_TTY_CONFIG CAP_MKNOD CAP_LEASE CAP_AUDIT_WRITE CAP_AUDIT_CONTROL CAP_SETFCAP
    CAP_MAC_OVERRIDE CAP_MAC_ADMIN CAP_SYSLOG CAP_WAKE_ALARM CAP_BLOCK_SUSPEND CAP_AUDIT_READ
    CAP_PERFMON CAP_BPF CAP_CHECKPOINT_RESTORE)
  allowed=()
  for i in "${!names[@]}"; do
    if (( (16#$bounding >> i) & 1 )); then allowed+=("\"${names[$i]}\""); fi
  done
  allowed_json="[$(IFS=,; echo "${allowed[*]}")]"
  wrapper=/usr/local/sbin/ec2tl-runc
  sed -e "s|@REAL_RUNC@|$real_runc|" -e "s|@ALLOWED@|$allowed_json|" \
    "$here/runc-wrapper.sh" >"$wrapper.tmp"
  chmod 0755 "$wrapper.tmp"
  mv "$wrapper.tmp" "$wrapper"
  mkdir -p /etc/docker
  conf=/etc/docker/daemon.json
  [[ -s "$conf" ]] || echo '{}' >"$conf"
  jq --arg path "$wrapper" '.runtimes["ec2tl-runc"] = {path: $path} | ."default-runtime" = "ec2tl-runc"' \
    "$conf" >"$conf.tmp"
  mv "$conf.tmp" "$conf"
  stop_dockerd
  start_dockerd
  install_guard
  guard_installed || { log "the egress guard is gone after the restart; refusing to go on"; exit 1; }
  probe || { log "privileged containers still fail:"; cat "$state/probe.err" >&2; exit 1; }
  log "privileged containers work through the runc wrapper"
fi

# --- check the guard: a container must be refused by a listener outside its networks ------------
# "Outside" is a network namespace on this machine (veth + TEST-NET-2): nothing is sent beyond
# this host even if the guard were missing.
sink_ns=ec2tl-sink
sink_ip=198.51.100.7
if ! ip netns list | grep -qw "$sink_ns"; then
  ip netns add "$sink_ns"
  ip link add ec2tl-sink-h type veth peer name ec2tl-sink-n
  ip link set ec2tl-sink-n netns "$sink_ns"
  ip addr add 198.51.100.1/24 dev ec2tl-sink-h
  ip link set ec2tl-sink-h up
  ip -n "$sink_ns" addr add "$sink_ip/24" dev ec2tl-sink-n
  ip -n "$sink_ns" link set ec2tl-sink-n up
  ip -n "$sink_ns" link set lo up
fi
route=$(ip route get "$sink_ip")
if [[ "$route" != *"dev ec2tl-sink-h"* ]]; then
  log "the sink address is not routed into its namespace ($route); not checking the guard"
  exit 1
fi
ip netns exec "$sink_ns" /bin/busybox nc -l -p 8 -e /bin/busybox true >/dev/null 2>&1 &
listener=$!
sleep 0.3
# Same answer on a bridge network as on docker0: both are guarded.
docker network inspect ec2tl-guard-check >/dev/null 2>&1 ||
  docker network create --driver bridge ec2tl-guard-check >/dev/null
verdict=$(docker run --rm --pull=never --network ec2tl-guard-check "$probe_image" \
  sh -c "nc -w 3 $sink_ip 8 </dev/null && echo reached || echo refused" 2>&1 || true)
kill "$listener" 2>/dev/null || true
wait "$listener" 2>/dev/null || true
if [[ "$verdict" != *refused* ]]; then
  log "a container reached an address outside the container networks ($verdict): guard broken"
  exit 1
fi
log "egress guard checked: a container cannot reach past the container networks"
