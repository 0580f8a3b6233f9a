#!/usr/bin/env bash
# Make this machine able to run kind, safely, from nothing — and change it no further:
#   1. Debian's Docker engine (docker.io) and the tools the kind path needs (apt);
#   2. dockerd running (started here when no engine answers);
#   3. the egress guard, before any container starts: packets forwarded from the suite's two
#      Docker networks (bridges ec2tl-kind, IPv4, and ec2tl-kind6, IPv4 + IPv6) to anywhere
#      outside that network are rejected (iptables DOCKER-USER, ip6tables FORWARD). Every
#      container the suite starts is on one of them or on none; nothing a container or a pod
#      there sends can leave this machine. Other containers on this machine are not touched;
#   4. those two networks;
#   5. a probe: a privileged container with no network. Only if it fails (a sandbox whose
#      capability bounding set lacks some capability Docker grants privileged containers, e.g.
#      CAP_SYS_RESOURCE) is a runc wrapper installed as dockerd's default runtime: it drops the
#      capabilities outside the bounding set from each container's spec (create/run) and from
#      `runc exec --process` specs. On a normal Docker host nothing changes.
#   6. the guard is checked without sending anything outward: a network namespace on this
#      machine plays "outside" (a veth, TEST-NET-2 and 2001:db8:: addresses, a listener) and a
#      container on each network must be refused there, over IPv4 and over IPv6.
#
#   e2e/kind/host.sh            idempotent; prints nothing on stdout
#   e2e/kind/host.sh --check    only check the guard (exit 1 when it is missing)
#   e2e/kind/host.sh --remove   undo 3, 4 and 6 (make kind-down): the rules, the networks, the
#                               namespace; the packages, dockerd and the wrapper stay
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
state=${EC2TL_CACHE:-$HOME/.cache/ec2-topology-labeler}/kind-host
mkdir -p "$state"
log() { echo "[kind-host] $*" >&2; }

# The suite's Docker networks, by bridge name (= network name). run.sh creates its clusters on
# them (KIND_EXPERIMENTAL_DOCKER_NETWORK); registry.sh puts the registry on both.
NETWORK4=ec2tl-kind
NETWORK6=ec2tl-kind6
SUBNET6=fd7c:ec21:ab::/64
BRIDGES=("$NETWORK4" "$NETWORK6")

# --- the egress guard --------------------------------------------------------------------------
# A packet that comes in on one of our bridges and would go out on anything else is leaving
# that network. Rejected, not dropped: a client fails at once instead of hanging.
guard_rule() { echo "-i $1 ! -o $1 -j REJECT"; }

install_guard() {
  # DOCKER-USER is Docker's place for the host's own rules: FORWARD jumps to it first, and
  # dockerd never flushes it (also not on restart).
  iptables -N DOCKER-USER 2>/dev/null || true
  iptables -C FORWARD -j DOCKER-USER 2>/dev/null || iptables -I FORWARD 1 -j DOCKER-USER
  local bridge rule
  for bridge in "${BRIDGES[@]}"; do
    read -ra rule <<<"$(guard_rule "$bridge")"
    iptables -C DOCKER-USER "${rule[@]}" 2>/dev/null || iptables -I DOCKER-USER 1 "${rule[@]}"
    # dockerd 20.10 (Debian's) manages no IPv6 rules: the IPv6 guard sits in FORWARD itself;
    # an engine that does (27 and later) jumps to its own DOCKER-USER first: there too.
    ip6tables -C FORWARD "${rule[@]}" 2>/dev/null || ip6tables -I FORWARD 1 "${rule[@]}"
    if ip6tables -S DOCKER-USER >/dev/null 2>&1; then
      ip6tables -C DOCKER-USER "${rule[@]}" 2>/dev/null || ip6tables -I DOCKER-USER 1 "${rule[@]}"
    fi
  done
  remove_guard "${LEGACY_BRIDGES[@]}"
}

# Earlier versions of this script guarded every Docker bridge (docker0, br-+), cutting the
# egress of containers that are none of the suite's business.
LEGACY_BRIDGES=(docker0 'br-+')

remove_guard() {
  local bridge rule
  for bridge in "$@"; do
    read -ra rule <<<"$(guard_rule "$bridge")"
    while iptables -D DOCKER-USER "${rule[@]}" 2>/dev/null; do :; done
    while ip6tables -D FORWARD "${rule[@]}" 2>/dev/null; do :; done
    while ip6tables -D DOCKER-USER "${rule[@]}" 2>/dev/null; do :; done
  done
}

guard_installed() {
  local rules4 rules6 bridge
  rules4=$(iptables -S DOCKER-USER 2>/dev/null) || return 1
  iptables -S FORWARD 2>/dev/null | grep -q -- '-A FORWARD -j DOCKER-USER' || return 1
  rules6=$(ip6tables -S FORWARD 2>/dev/null) || return 1
  for bridge in "${BRIDGES[@]}"; do
    grep -q -- "$(guard_rule "$bridge")" <<<"$rules4" || return 1
    grep -q -- "$(guard_rule "$bridge")" <<<"$rules6" || return 1
  done
}

sink_ns=ec2tl-sink
sink_ip=198.51.100.7
sink_ip6=2001:db8:7::7

if [[ "${1:-}" == "--check" ]]; then
  guard_installed || { log "the egress guard is NOT installed"; exit 1; }
  log "egress guard installed"
  exit 0
fi

if [[ "${1:-}" == "--remove" ]]; then
  if command -v docker >/dev/null && ! timeout 10 docker info >/dev/null 2>&1; then
    # Its networks (and anything on them) would come back with it, unguarded.
    log "Docker does not answer: its networks cannot be removed, so the egress guard stays; start dockerd and run this again"
    exit 1
  fi
  for n in "${BRIDGES[@]}"; do
    if command -v docker >/dev/null && docker network inspect "$n" >/dev/null 2>&1; then
      docker network rm "$n" >/dev/null || log "network $n is still in use; left in place"
    fi
  done
  # The guard goes only once its networks are gone: never a network without it.
  left=0
  for n in "${BRIDGES[@]}"; do
    command -v docker >/dev/null && docker network inspect "$n" >/dev/null 2>&1 && left=1
  done
  if ((left == 0)) && command -v iptables >/dev/null; then remove_guard "${BRIDGES[@]}" "${LEGACY_BRIDGES[@]}"; fi
  ip netns list 2>/dev/null | grep -qw "$sink_ns" && ip netns delete "$sink_ns"
  ip link delete ec2tl-sink-h 2>/dev/null || true
  docker network rm ec2tl-guard-check >/dev/null 2>&1 || true
  log "egress guard, networks and the check's namespace removed (Docker, its packages and the runc wrapper stay)"
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
  # One apt at a time across this project's scripts (CI runs some side by side).
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
  flock /var/lock/ec2tl-apt.lock apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${need[@]}" >&2
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

# The rules first: they name bridges, not addresses, so they hold before the networks exist,
# and a dockerd started here (or by systemd after a reboot, with containers set to restart)
# never runs a container on our networks without them.
install_guard
guard_installed || { log "could not install the egress guard; refusing to go on"; exit 1; }
docker_up || start_dockerd

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
  install_guard
  start_dockerd
  guard_installed || { log "the egress guard is gone after the restart; refusing to go on"; exit 1; }
  probe || { log "privileged containers still fail:"; cat "$state/probe.err" >&2; exit 1; }
  log "privileged containers work through the runc wrapper"
fi

# --- the networks, once the guard covers them ------------------------------------------------
# kind would create its own "kind" network (IPv4 and IPv6): run.sh points it at these instead.
# NAT stays on, as kind sets it: the guard, not the absence of NAT, is what keeps packets in.
if ! docker network inspect "$NETWORK4" >/dev/null 2>&1; then
  docker network create --driver bridge -o com.docker.network.bridge.name="$NETWORK4" \
    -o com.docker.network.bridge.enable_ip_masquerade=true "$NETWORK4" >/dev/null
fi
if ! docker network inspect "$NETWORK6" >/dev/null 2>&1; then
  docker network create --driver bridge --ipv6 --subnet "$SUBNET6" \
    -o com.docker.network.bridge.name="$NETWORK6" \
    -o com.docker.network.bridge.enable_ip_masquerade=true "$NETWORK6" >/dev/null
fi

# --- check the guard: a container must be refused by a listener outside its network -----------
# "Outside" is a network namespace on this machine (veth + TEST-NET-2 and 2001:db8::/32): nothing
# is sent beyond this host even if the guard were missing. The host itself reaching the listener
# first shows the listener answers (else "refused" would prove nothing).
# A namespace made by an earlier version of this script has no IPv6 address: made again.
if ip netns list | grep -qw "$sink_ns" && ! ip -n "$sink_ns" -6 addr show | grep -q "$sink_ip6"; then
  ip netns delete "$sink_ns"
  ip link delete ec2tl-sink-h 2>/dev/null || true
fi
if ! ip netns list | grep -qw "$sink_ns"; then
  ip netns add "$sink_ns"
  ip link add ec2tl-sink-h type veth peer name ec2tl-sink-n
  ip link set ec2tl-sink-n netns "$sink_ns"
  ip addr add 198.51.100.1/24 dev ec2tl-sink-h
  ip -6 addr add 2001:db8:7::1/64 dev ec2tl-sink-h nodad
  ip link set ec2tl-sink-h up
  ip -n "$sink_ns" addr add "$sink_ip/24" dev ec2tl-sink-n
  ip -n "$sink_ns" -6 addr add "$sink_ip6/64" dev ec2tl-sink-n nodad
  ip -n "$sink_ns" link set ec2tl-sink-n up
  ip -n "$sink_ns" link set lo up
fi
for ip in "$sink_ip" "$sink_ip6"; do
  route=$(ip route get "$ip")
  if [[ "$route" != *"dev ec2tl-sink-h"* ]]; then
    log "the sink address $ip is not routed into its namespace ($route); not checking the guard"
    exit 1
  fi
done
# One connection per listener, as seen from $1 (host | NETWORK): what nc printed, then REACHED
# or FAILED.
attempt() {
  local from=$1 ip=$2 listener verdict
  ip netns exec "$sink_ns" /bin/busybox nc -l -p 8 -e /bin/busybox true >/dev/null 2>&1 &
  listener=$!
  sleep 0.3
  if [[ $from == host ]]; then
    verdict=$(/bin/busybox nc -w 3 "$ip" 8 </dev/null 2>&1 && echo REACHED || echo FAILED)
  else
    verdict=$(docker run --rm --pull=never --network "$from" "$probe_image" \
      sh -c "nc -w 3 $ip 8 </dev/null 2>&1 && echo REACHED || echo FAILED" 2>&1 || true)
  fi
  kill "$listener" 2>/dev/null || true
  wait "$listener" 2>/dev/null || true
  echo "$verdict"
}
for ip in "$sink_ip" "$sink_ip6"; do
  [[ $(attempt host "$ip") == *REACHED* ]] ||
    { log "the check's listener at $ip does not answer this host; cannot check the guard"; exit 1; }
done
# Refused at once by the guard's REJECT (an ICMP "port unreachable": ECONNREFUSED), not merely
# unanswered (a timeout would also be what a missing route or forwarding switched off gives,
# and would prove nothing about the guard).
for pair in "$NETWORK4 $sink_ip" "$NETWORK6 $sink_ip" "$NETWORK6 $sink_ip6"; do
  read -r network ip <<<"$pair"
  verdict=$(attempt "$network" "$ip")
  if [[ "$verdict" == *REACHED* ]]; then
    log "a container on $network reached $ip, outside its network ($verdict): guard broken"
    exit 1
  fi
  if [[ "$verdict" != *"Connection refused"* ]]; then
    log "a container on $network failed to reach $ip, but not by the guard's refusal ($verdict): cannot tell the guard works"
    exit 1
  fi
done
log "egress guard checked: containers on $NETWORK4 and $NETWORK6 cannot reach past their network (IPv4, IPv6)"
