#!/usr/bin/env bash
# rping between two hosts on a network, emulated as two network namespaces
# joined by a veth pair (as tests/e2e/netns/netns_pingpong_test.sh does),
# on both engines: the server in one namespace binds its address (its
# device takes it, `rdmaemu run --address`), the client in the other
# connects to it through RDMA CM; -v -C 3 prints the three ping data lines
# on both sides, -C 1000 -V -S 4096 verifies every buffer; the MADs and
# the RoCE packets really cross the veth (its packet counters, and the
# server's capture shows the CM's REQ from the client's address).
#   netns_rping_test.sh RDMAEMU LIBRDMACM
# Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); not root, or `ip netns add`
# refused: prints SKIP and exits 0.
set -u
export PATH="$PATH:/usr/sbin:/sbin"
rdmaemu="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
libdir="$(cd "$(dirname "$2")" && pwd)"
unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB RDMAEMU_FAULTS RDMAEMU_PCAP
export RDMAEMU_LOG=warn
# shellcheck source=tests/e2e/rping_race.sh
source "$(dirname "$0")/../rping_race.sh"

skip() { echo "SKIP: $*"; exit 0; }
if [[ "$(id -u)" != 0 ]]; then
  skip "not root (uid $(id -u)); network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN"
fi
for p in ip timeout rping tshark; do
  command -v "$p" >/dev/null || { echo "FAIL: $p is not installed (tools/setup installs it)"; exit 1; }
done

for _ in $(seq 1 20); do
  id="$(printf '%05x' $(( ($$ * 32768 + RANDOM) % 0x100000 )))"
  ns_a="rdmaemu-$id-a"; ns_b="rdmaemu-$id-b"
  veth_a="rdcm${id}a"; veth_b="rdcm${id}b"
  ip netns list 2>/dev/null | grep -q "^rdmaemu-$id-" ||
    ip link show "$veth_a" >/dev/null 2>&1 || ip link show "$veth_b" >/dev/null 2>&1 ||
    break
done
used="$(ip -4 -o addr show 2>/dev/null)"
for _ in $(seq 1 50); do
  x=$(( RANDOM % 254 + 1 ))
  grep -q "inet 10\.78\.$x\." <<<"$used" || break
done
ip_a="10.78.$x.1"
ip_b="10.78.$x.2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/netns-rping.XXXXXX")"

server_pid=""
cleanup() {
  trap - EXIT INT TERM HUP
  if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; fi
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
if ! { ip netns add "$ns_b" &&
       ip link add "$veth_a" type veth peer name "$veth_b" &&
       ip link set "$veth_a" netns "$ns_a" &&
       ip link set "$veth_b" netns "$ns_b" &&
       ip -n "$ns_a" addr add "$ip_a/24" dev "$veth_a" &&
       ip -n "$ns_b" addr add "$ip_b/24" dev "$veth_b" &&
       ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
       ip -n "$ns_a" link set "$veth_a" mtu 9000 && ip -n "$ns_b" link set "$veth_b" mtu 9000 &&
       ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up; }; then
  echo "FAIL: could not set up the namespaces and the veth pair"
  exit 1
fi
for _ in $(seq 1 50); do
  ip -n "$ns_a" link show "$veth_a" | grep -q LOWER_UP &&
    ip -n "$ns_b" link show "$veth_b" | grep -q LOWER_UP && break
  sleep 0.1
done
echo "namespaces $ns_a ($veth_a $ip_a) and $ns_b ($veth_b $ip_b)"

failures=0
tx_packets() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_packets"; }

# pair NAME ENGINE MIN_PACKETS RPING_ARGS...: server in a, client in b.
pair() {
  local name="$1" engine="$2" min="$3"
  shift 3
  local slog="$work/$name.server" clog="$work/$name.client" spcap="$work/$name.pcap" why=""
  local tx_a0 tx_b0
  tx_a0="$(tx_packets "$ns_a" "$veth_a")"; tx_b0="$(tx_packets "$ns_b" "$veth_b")"
  ip netns exec "$ns_a" env RDMAEMU_PCAP="$spcap" timeout 60 \
    "$rdmaemu" run --lib "$libdir" --engine "$engine" --address "$ip_a" -- \
    rping -s -a "$ip_a" "$@" >"$slog" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    ip netns exec "$ns_a" ss -Hlun "src = $ip_a:4791" 2>/dev/null | grep -q . && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  sleep 0.2
  ip netns exec "$ns_b" timeout 60 \
    "$rdmaemu" run --lib "$libdir" --engine "$engine" --address "$ip_b" -- \
    rping -c -a "$ip_a" "$@" >"$clog" 2>&1
  local client_rc=$?
  (( client_rc != 0 )) && { sleep 2; kill "$server_pid" 2>/dev/null; }
  wait "$server_pid"
  local server_rc=$?
  server_pid=""
  if rping_lost_teardown_race "$server_rc" "$slog"; then
    echo "note: the server lost rping's teardown race; counted as passed"
    server_rc=0
  fi
  local tx_a=$(( $(tx_packets "$ns_a" "$veth_a") - tx_a0 ))
  local tx_b=$(( $(tx_packets "$ns_b" "$veth_b") - tx_b0 ))
  (( client_rc == 0 )) || why+=" client exit $client_rc;"
  (( server_rc == 0 )) || why+=" server exit $server_rc;"
  grep -qE 'mismatch|cma event|error [-0-9]' "$clog" && why+=" client reported an error;"
  (( tx_a >= min && tx_b >= min )) || why+=" only $tx_a/$tx_b packets crossed the veth, want $min each way;"
  local req
  req=$(tshark -r "$spcap" -Y 'infiniband.mad.attributeid == 0x0010' -T fields -e ip.src -e ip.dst \
        -e infiniband.cm.req.prim_localgid_ipv4 2>/dev/null | head -1 | tr '\t' ' ')
  [[ "$req" == "$ip_b $ip_a $ip_b" ]] || why+=" the server's capture has REQ '$req', want '$ip_b $ip_a $ip_b' (src dst GID);"
  if [[ "$name" == *-v ]]; then
    local nc ns
    nc=$(grep -cE '^ping data: rdma-ping-[012]: ' "$clog")
    ns=$(grep -cE '^server ping data: rdma-ping-[012]: ' "$slog")
    (( nc == 3 && ns == 3 )) || why+=" $nc client and $ns server ping data lines, want 3 each;"
  fi
  if [[ -n "$why" ]]; then
    echo "FAIL: $name ($*):$why"
    echo "--- client ($ns_b):"; sed 's/^/    /' "$clog" | head -30
    echo "--- server ($ns_a):"; sed 's/^/    /' "$slog" | head -30
    failures=$(( failures + 1 ))
  else
    echo "ok: $name: rping $*, veth packets $tx_a/$tx_b"
    [[ "$name" == *-v ]] && { sed 's/^/    client: /' "$clog"; sed 's/^/    server: /' "$slog"; }
  fi
}

for engine in uring epoll; do
  pair "$engine-v" "$engine" 10 -v -C 3
  pair "$engine-V" "$engine" 2000 -V -C 1000 -S 4096
done

if (( failures == 0 )); then echo "PASS"; else echo "$failures failure(s)"; fi
exit $(( failures > 0 ))
