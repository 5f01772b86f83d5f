#!/usr/bin/env bash
# Debian's unmodified mckey: a receiver (`mckey -m GROUP -b ADDR`) and a
# sender (`mckey -m GROUP -s -b ADDR`, a full member; then `-o`, a
# send-only one) in two processes, each its own host, on both engines. The
# receiver prints "data transfers complete" only once it has polled a
# completion for every message the sender sent (mckey's exit status is 0
# even when its join failed, so the lines are what is checked).
# The sender posts its sends unsignaled and destroys its QP at once: they
# reach the wire only because a destroy first lets the engine start what
# was posted, as a NIC has sent it long before.
#   mckey_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need mckey stdbuf ss

# A group of 239/8 for one run, so tests running at once never share one.
new_group() {
  echo "239.$(( ($$ + RANDOM) % 256 )).$((RANDOM % 256)).$((1 + RANDOM % 254))"
}

# start_receiver NAME ADDR GROUP ARGS...: mckey's receiver in the
# background (line-buffered, so its join can be seen); returns once it has
# joined, or exited, or after 10 s.
start_receiver() {
  local name="$1" addr="$2" group="$3"
  shift 3
  server_log="$tmp/$name.receiver"
  timeout 30 "$rdmaemu" run --lib "$libdir" --engine "$engine" -- \
    stdbuf -oL mckey -m "$group" -b "$addr" "$@" >"$server_log" 2>&1 &
  server_pid=$!
  for _ in $(seq 200); do
    grep -qE '^mckey: (joined|event)' "$server_log" && return 0
    kill -0 "$server_pid" 2>/dev/null || return 0
    sleep 0.05
  done
}

# run_pair NAME COUNT SIZE SENDER_FLAGS...: a receiver and a sender of
# COUNT messages of SIZE bytes on a fresh group, each its own host.
run_pair() {
  local name="$1" count="$2" size="$3"
  shift 3
  local r s g
  r=$(new_host)
  s=$(new_host)
  g=$(new_group)
  echo "== $name: group $g, receiver $r, sender $s ($*)"
  start_receiver "$name" "$r" "$g" -C "$count" -S "$size"
  checks=$((checks + 1))
  if ! grep -qE "^mckey: joined dgid: ::ffff:$g mlid 0x0 sl 0$" "$server_log"; then
    fail "$name: the receiver did not join $g (its ibv_attach_mcast failed?):"
    cleanup_server; server_pid=""
    sed 's/^/    /' "$server_log" | head -20
    return
  fi
  if client "$name" 0 mckey -m "$g" -s -b "$s" -C "$count" -S "$size" "$@"; then
    has "$name sender" "$out" "^mckey: joined dgid: ::ffff:$g mlid 0x0 sl 0$"
    has "$name sender" "$out" '^initiating data transfers$'
    has "$name sender" "$out" '^data transfers complete$'
    hasnt "$name sender" "$out" 'MULTICAST_ERROR|failure|failed'
    sane "$name sender" "$out"
  fi
  # It exits only after a completion for each of the COUNT messages.
  wait_server "$name receiver" 0
  has "$name receiver" "$server_log" '^receiving data transfers$'
  has "$name receiver" "$server_log" '^data transfers complete$'
  has "$name receiver" "$server_log" '^return status 0$'
  hasnt "$name receiver" "$server_log" 'MULTICAST_ERROR|failure|failed'
  sane "$name receiver" "$server_log"
  echo "receiver:"; sed 's/^/    /' "$server_log"
  echo "sender:"; sed 's/^/    /' "$out"
}

for engine in uring epoll; do
  run_pair "$engine-full" 10 100
  run_pair "$engine-sendonly" 50 1024 -o
done

finish
