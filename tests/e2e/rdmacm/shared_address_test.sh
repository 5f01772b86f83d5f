#!/usr/bin/env bash
# Several processes at one address, as on a real host (emulator/device/hosts.h),
# on both engines, with Debian's unmodified programs:
#  - rping's server binds address A (host slot 0, UDP 4791) and its client
#    connects from A too (-I A: slot 1, an ephemeral UDP port): the client's
#    REQ finds the server by service, the rest by communication IDs and QPNs;
#  - with ibv_rc_pingpong's server already at B (slot 0, no CM), an rping
#    server at B (slot 1) gets the REQs of an rping client at B (slot 2)
#    through its listener record; a second rping server on the same port at
#    B is refused (EADDRINUSE); then an ibv_rc_pingpong client at B (the
#    first free slot > 0, the rpings having ended) reaches the pingpong
#    server by QPN alone.
#   shared_address_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need rping ibv_rc_pingpong ss

for engine in uring epoll; do
  a=$(new_host)
  echo "== $engine: rping server and client both at $a"
  start_server "$engine-same" "$a" rping -s -a "$a" -v -C 3
  if RDMAEMU_LOG=info client "$engine-same" 0 rping -c -I "$a" -a "$a" -v -C 3; then
    wait_server "$engine-same" 0
    count_is "$engine-same client" "$out" '^ping data: rdma-ping-[0-9]+: ' 3
    count_is "$engine-same server" "$server_log" '^server ping data: rdma-ping-[0-9]+: ' 3
    has "$engine-same client" "$out" "$a is another process's too; this process is host slot 1 there"
    sane "$engine-same client" "$out"
    sane "$engine-same server" "$server_log"
  else
    cleanup_server; server_pid=""
  fi

  b=$(new_host)
  tcp_port=$((20000 + RANDOM % 20000))
  echo "== $engine: ibv_rc_pingpong server (slot 0), rping server (slot 1) and client (slot 2), all at $b"
  holder_log="$tmp/$engine-holder"
  RDMAEMU_ADDRESS="$b" timeout 60 "$rdmaemu" run --lib "$libdir" --engine "$engine" -- \
      ibv_rc_pingpong -g 0 -p "$tcp_port" -n 100 >"$holder_log" 2>&1 &
  holder_pid=$!
  for _ in $(seq 100); do
    ss -Hlun "src = $b:4791" 2>/dev/null | grep -q . && break
    sleep 0.05
  done
  start_server "$engine-slot1" "$b" rping -s -a "$b" -p 7471 -v -C 3
  # A second listener on the same port of the same address is refused.
  client "$engine-twice" fail rping -s -a "$b" -p 7471 -v -C 1
  has "$engine-twice" "$out" 'in use|Address already in use'
  if client "$engine-slot2" 0 rping -c -I "$b" -a "$b" -p 7471 -v -C 3; then
    wait_server "$engine-slot1" 0
    count_is "$engine-slot2 client" "$out" '^ping data: rdma-ping-[0-9]+: ' 3
    count_is "$engine-slot1 server" "$server_log" '^server ping data: rdma-ping-[0-9]+: ' 3
    sane "$engine-slot2 client" "$out"
  else
    cleanup_server; server_pid=""
  fi
  # No CM: the client's QP reaches the server's by the slot in its QPN.
  RDMAEMU_ADDRESS="$b" client "$engine-pingpong" 0 ibv_rc_pingpong -g 0 -p "$tcp_port" -n 100 127.0.0.1
  has "$engine-pingpong client" "$out" '[0-9]+ iters in'
  checks=$((checks + 1))
  if ! wait "$holder_pid"; then
    fail "$engine: the ibv_rc_pingpong server failed; its output:"
    sed 's/^/    /' "$holder_log" | head -20
  fi
  has "$engine-pingpong server" "$holder_log" '[0-9]+ iters in'
done

finish
