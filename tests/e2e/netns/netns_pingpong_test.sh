#!/usr/bin/env bash
# Two hosts on a network, emulated with two network namespaces joined by a
# veth pair: Debian's unmodified ibv_*_pingpong runs as server in one
# namespace and as client in the other, each process on our libibverbs.so.1
# with its port bound to its namespace's address (RDMAEMU_ADDRESS), on both
# engines (io_uring, then epoll). The RoCEv2 packets really cross the veth:
# the test checks the veths' packet counters as well as the programs' output
# and the GIDs they print (::ffff:<the other side's IPv4 address>).
#
# Usage: netns_pingpong_test.sh PROGRAM LIBIBVERBS
#   PROGRAM     ibv_ud_pingpong or ibv_rc_pingpong (any pingpong taking
#               -g -p -c -s -n)
#   LIBIBVERBS  the built libibverbs.so.1
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN, as `ip netns` does). Not root,
# or `ip netns add` refused (an unprivileged container): prints SKIP and
# exits 0. CI runs as root, so there it runs.
#
# Two real hosts are the same thing without the namespaces: on each host set
# RDMAEMU_ADDRESS to that host's interface address (the port binds UDP
# (address, 4791); its GID 0 is ::ffff:address), let UDP 4791 and the
# pingpong's TCP port through the firewall, and run, e.g.
#   hostA$ RDMAEMU_ADDRESS=192.0.2.1 LD_LIBRARY_PATH=DIR ibv_ud_pingpong -g 0
#   hostB$ RDMAEMU_ADDRESS=192.0.2.2 LD_LIBRARY_PATH=DIR ibv_ud_pingpong -g 0 192.0.2.1
# where DIR holds only our libibverbs.so.1 (or use `rdmaemu run --`).
# The port reports an active MTU of 4096: UD messages (and RC/UC path MTUs)
# above 1024 bytes need jumbo frames on the link (this test sets MTU 9000).
set -u
export PATH="$PATH:/usr/sbin:/sbin"

prog="${1:?usage: $0 PROGRAM LIBIBVERBS}"
lib_src="${2:?usage: $0 PROGRAM LIBIBVERBS}"
iters=200
size=2048

skip() { echo "SKIP: $*"; exit 0; }

if [[ "$(id -u)" != 0 ]]; then
  skip "not root (uid $(id -u)); network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
fi
for p in ip ss timeout "$prog"; do
  if ! command -v "$p" >/dev/null; then
    echo "FAIL: $p is not installed (tools/setup installs iproute2 and ibverbs-utils)"
    exit 1
  fi
done

# Unique per run: two runs of this test (or of its two targets) at once
# never share a name. Interface names stay under 16 characters.
for _ in $(seq 1 20); do
  id="$(printf '%05x' $(( ($$ * 32768 + RANDOM) % 0x100000 )))"
  ns_a="rdmaemu-$id-a"
  ns_b="rdmaemu-$id-b"
  veth_a="rdve${id}a"
  veth_b="rdve${id}b"
  ip netns list 2>/dev/null | grep -q "^rdmaemu-$id-" ||
    ip link show "$veth_a" >/dev/null 2>&1 || ip link show "$veth_b" >/dev/null 2>&1 ||
    break
done
# A /24 of 10.77.0.0/16 that no interface of this namespace uses (the two
# namespaces are private, so only a route here could be confused with them).
used="$(ip -4 -o addr show 2>/dev/null)"
for _ in $(seq 1 50); do
  x=$(( RANDOM % 254 + 1 ))
  grep -q "inet 10\.77\.$x\." <<<"$used" || break
done
ip_a="10.77.$x.1"
ip_b="10.77.$x.2"

work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns.XXXXXX")"
libdir="$work/lib"
mkdir -p "$libdir"
cp "$lib_src" "$libdir/libibverbs.so.1"

server_pid=""
cleanup() {
  trap - EXIT INT TERM HUP
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  # Deleting a namespace deletes the veth end inside it and with it the peer;
  # the `link del`s cover a failure before the ends were moved.
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  ip link del "$veth_a" 2>/dev/null
  ip link del "$veth_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if ! err="$(ip netns add "$ns_a" 2>&1)"; then
  skip "ip netns add refused: $err"
fi
setup() {
  ip netns add "$ns_b" &&
  ip link add "$veth_a" type veth peer name "$veth_b" &&
  ip link set "$veth_a" netns "$ns_a" &&
  ip link set "$veth_b" netns "$ns_b" &&
  ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a" &&
  ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b" &&
  ip -n "$ns_a" link set lo up &&
  ip -n "$ns_b" link set lo up &&
  ip -n "$ns_a" link set "$veth_a" mtu 9000 &&
  ip -n "$ns_b" link set "$veth_b" mtu 9000 &&
  ip -n "$ns_a" link set "$veth_a" up &&
  ip -n "$ns_b" link set "$veth_b" up
}
# Jumbo frames, as RoCE fabrics use: the port reports an active MTU of 4096,
# and a 2048-byte UD message with its headers does not fit a 1500-byte frame.
if ! setup; then
  echo "FAIL: could not set up the namespaces and the veth pair"
  exit 1
fi
# Both ends carry traffic once the link is up (IPv4 has no DAD to wait for).
for _ in $(seq 1 50); do
  ip -n "$ns_a" link show "$veth_a" | grep -q LOWER_UP &&
    ip -n "$ns_b" link show "$veth_b" | grep -q LOWER_UP && break
  sleep 0.1
done
echo "namespaces $ns_a ($veth_a $ip_a) and $ns_b ($veth_b $ip_b)"

# Line-buffered output, so that a run killed by `timeout` still shows how far
# it got.
linebuf=()
command -v stdbuf >/dev/null && linebuf=(stdbuf -oL)

failures=0
tx_packets() {  # NS DEV
  ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_packets"
}

run_pair() {  # ENGINE
  local engine="$1"
  local port=$(( 20000 + RANDOM % 20000 ))
  local slog="$work/server.$engine.log" clog="$work/client.$engine.log"
  local why=""
  local tx_a0 tx_b0
  tx_a0="$(tx_packets "$ns_a" "$veth_a")"
  tx_b0="$(tx_packets "$ns_b" "$veth_b")"

  local start=$SECONDS
  ip netns exec "$ns_a" env RDMAEMU_ENGINE="$engine" RDMAEMU_ADDRESS="$ip_a" \
    LD_LIBRARY_PATH="$libdir" timeout 60 "${linebuf[@]}" \
    "$prog" -g 0 -p "$port" -c -s "$size" -n "$iters" >"$slog" 2>&1 &
  server_pid=$!
  # Connect only once the server listens (the client does not retry).
  for _ in $(seq 1 100); do
    ip netns exec "$ns_a" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  ip netns exec "$ns_b" env RDMAEMU_ENGINE="$engine" RDMAEMU_ADDRESS="$ip_b" \
    LD_LIBRARY_PATH="$libdir" timeout 60 "${linebuf[@]}" \
    "$prog" -g 0 -p "$port" -c -s "$size" -n "$iters" "$ip_a" >"$clog" 2>&1
  local client_rc=$?
  # A failed client leaves the server waiting for it: don't wait out the
  # server's timeout.
  if (( client_rc != 0 )); then
    sleep 2
    kill "$server_pid" 2>/dev/null
  fi
  wait "$server_pid"
  local server_rc=$?
  server_pid=""
  local secs=$(( SECONDS - start ))

  local tx_a=$(( $(tx_packets "$ns_a" "$veth_a") - tx_a0 ))
  local tx_b=$(( $(tx_packets "$ns_b" "$veth_b") - tx_b0 ))

  (( client_rc == 0 )) || why+=" client exit $client_rc;"
  (( server_rc == 0 )) || why+=" server exit $server_rc;"
  grep -q "^$iters iters in" "$clog" || why+=" client did not print '$iters iters in';"
  grep -q "^$iters iters in" "$slog" || why+=" server did not print '$iters iters in';"
  grep -qi "invalid data" "$clog" "$slog" && why+=" invalid data (-c);"
  grep -qE "remote address:.*GID ::ffff:${ip_a//./\\.}\$" "$clog" ||
    why+=" client's remote GID is not ::ffff:$ip_a;"
  grep -qE "local address:.*GID ::ffff:${ip_b//./\\.}\$" "$clog" ||
    why+=" client's local GID is not ::ffff:$ip_b;"
  grep -qE "remote address:.*GID ::ffff:${ip_b//./\\.}\$" "$slog" ||
    why+=" server's remote GID is not ::ffff:$ip_b;"
  # Every iteration sends at least one packet each way over the veth.
  (( tx_a >= iters )) || why+=" only $tx_a packets left $veth_a;"
  (( tx_b >= iters )) || why+=" only $tx_b packets left $veth_b;"

  if [[ -n "$why" ]]; then
    echo "FAIL: $prog engine=$engine:$why"
    echo "--- client ($ns_b):"; sed 's/^/    /' "$clog"
    echo "--- server ($ns_a):"; sed 's/^/    /' "$slog"
    failures=$(( failures + 1 ))
  else
    echo "ok: $prog engine=$engine -s $size -n $iters in ${secs}s," \
      "veth packets $tx_a/$tx_b: client: $(grep 'iters in' "$clog")"
  fi
}

for engine in uring epoll; do
  run_pair "$engine"
done

if (( failures == 0 )); then echo "PASS"; else echo "$failures failure(s)"; fi
exit $(( failures > 0 ))
