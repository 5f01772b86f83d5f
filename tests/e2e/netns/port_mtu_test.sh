#!/usr/bin/env bash
# The port's active MTU follows the MTU of the interface it is bound to, as
# on a real RoCE NIC: 1500-byte Ethernet gives 1024, jumbo frames give 4096.
#   port_mtu_test.sh LIBIBVERBS
set -u
lib_src="$1"
if [ "$(id -u)" -ne 0 ]; then echo "SKIP: not root"; exit 0; fi
command -v ibv_devinfo >/dev/null || { echo "FAIL: ibv_devinfo missing (run tools/setup)"; exit 1; }
ns="rdmaemu-mtu-$$"
libdir=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null; rm -rf "$libdir"; }
trap cleanup EXIT
cp "$lib_src" "$libdir/libibverbs.so.1"
if ! ip netns add "$ns" 2>/dev/null; then echo "SKIP: ip netns add refused"; exit 0; fi
ip netns exec "$ns" ip link add mtua type veth peer name mtub
ip netns exec "$ns" ip addr add 10.78.0.1/24 dev mtua
ip netns exec "$ns" ip link set mtua up
ip netns exec "$ns" ip link set mtub up
failures=0
check() {  # link mtu, expected active_mtu line
  ip netns exec "$ns" ip link set mtua mtu "$1"
  out=$(ip netns exec "$ns" env RDMAEMU_ADDRESS=10.78.0.1 LD_LIBRARY_PATH="$libdir" timeout 20 ibv_devinfo 2>&1)
  if grep -q "active_mtu:.*$2" <<<"$out"; then
    echo "ok: link MTU $1 -> active_mtu $2"
  else
    echo "FAIL: link MTU $1: expected active_mtu $2"; echo "$out"; failures=$((failures + 1))
  fi
}
check 1500 "1024 (3)"
check 2200 "2048 (4)"
check 9000 "4096 (5)"
[ $failures -eq 0 ] && echo PASS
exit $(( failures > 0 ))
