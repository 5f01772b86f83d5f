#!/usr/bin/env bash
# Debian's unmodified rping between two processes, each its own host, on
# both engines: -v -C 3 prints the three ping data lines on both sides;
# -C 1000 -V (the client checks every buffer the server wrote back) at the
# smallest size rping takes, 64 B, 4 KiB and the largest (65535 B), both
# sides exiting 0.
#   rping_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need rping ss

# rping's ping data (its default size is 64): "rdma-ping-N: ", then
# characters from 'A'+N up to 'z', wrapping to 'A', to 63 characters.
ping_line() {  # ping_line N: rping -v's line for message N
  local n="$1" s="rdma-ping-$1: " c=$(( 65 + $1 ))
  while (( ${#s} < 63 )); do
    s+=$(printf "\\$(printf '%03o' "$c")")
    c=$(( c == 122 ? 65 : c + 1 ))
  done
  printf '%s\n' "$s"
}

for engine in uring epoll; do
  a=$(new_host)
  echo "== $engine: rping -v -C 3 on host $a"
  start_server "$engine-v" "$a" rping -s -a "$a" -v -C 3
  if client "$engine-v" 0 rping -c -a "$a" -v -C 3; then
    wait_server "$engine-v" 0
    count_is "$engine-v client" "$out" '^ping data: rdma-ping-[0-9]+: ' 3
    count_is "$engine-v server" "$server_log" '^server ping data: rdma-ping-[0-9]+: ' 3
    for n in 0 1 2; do
      line=$(ping_line "$n")
      checks=$((checks + 1))
      grep -qxF "ping data: $line" "$out" ||
        fail "$engine-v: the client did not print 'ping data: $line'"
      checks=$((checks + 1))
      grep -qxF "server ping data: $line" "$server_log" ||
        fail "$engine-v: the server did not print 'server ping data: $line'"
    done
    # (The client may exit before its DISCONNECTED event is read: no check.)
    has "$engine-v server" "$server_log" '^server DISCONNECT EVENT'
    sane "$engine-v client" "$out"
    sane "$engine-v server" "$server_log"
    echo "client:"; sed 's/^/    /' "$out"
    echo "server:"; sed 's/^/    /' "$server_log"
  else
    cleanup_server; server_pid=""
  fi

  for size in 23 64 4096 65535; do
    a=$(new_host)
    name="$engine-C1000-S$size"
    start_server "$name" "$a" rping -s -a "$a" -V -C 1000 -S "$size"
    if client "$name" 0 rping -c -a "$a" -V -C 1000 -S "$size"; then
      wait_server "$name" 0
      hasnt "$name client" "$out" 'mismatch|error|failed'
      hasnt "$name server" "$server_log" 'mismatch|error|failed'
      sane "$name client" "$out"
      sane "$name server" "$server_log"
      echo "ok: $engine rping -C 1000 -V -S $size in ${elapsed_ms} ms"
    else
      cleanup_server; server_pid=""
    fi
  done
done

finish
