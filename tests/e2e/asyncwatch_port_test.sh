#!/bin/bash
# Issue 4's end-to-end flow: Debian's unmodified ibv_asyncwatch prints
# PORT_ERR then PORT_ACTIVE while `rdmaemu port emu0 1 down` and `... up`
# run from another process, on both engines. Also `rdmaemu event` on a port
# of the running program, and the socket gone after SIGTERM.
source "$(dirname "$0")/e2e_lib.sh"
need ibv_asyncwatch stdbuf

# wait_for FILE ERE: up to 10 s for a line of FILE to match.
wait_for() {
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

for engine in uring epoll; do
  # Sockets of our own: other tests' processes are not ours to act on.
  export RDMAEMU_CONTROL_DIR="$tmp/ctl-$engine"
  awout="$tmp/aw-$engine.out"
  RDMAEMU_ENGINE=$engine "$rdmaemu" run -- stdbuf -oL ibv_asyncwatch >"$awout" 2>"$tmp/aw-$engine.err" &
  pid=$!
  sock="$RDMAEMU_CONTROL_DIR/$pid.sock"
  for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.1; done
  checks=$((checks + 1))
  if [[ ! -S "$sock" ]]; then
    fail "$engine: ibv_asyncwatch (pid $pid) serves no control socket $sock after 10 s"
    kill "$pid"; wait "$pid"
    continue
  fi
  t "$engine-list" 0 "$rdmaemu" list &&
    has "$engine-list" "$tmp/$engine-list.out" '^emu0 port 1 ACTIVE$'
  t "$engine-down" 0 "$rdmaemu" port emu0 1 down &&
    has "$engine-down" "$tmp/$engine-down.out" '^emu0 port 1: DOWN \(was ACTIVE\)$'
  checks=$((checks + 1))
  wait_for "$awout" 'PORT_ERR' || fail "$engine: no PORT_ERR from ibv_asyncwatch within 10 s"
  t "$engine-up" 0 "$rdmaemu" port --pid "$pid" emu0 1 up &&
    has "$engine-up" "$tmp/$engine-up.out" '^emu0 port 1: ACTIVE \(was DOWN\)$'
  checks=$((checks + 1))
  wait_for "$awout" 'PORT_ACTIVE' || fail "$engine: no PORT_ACTIVE from ibv_asyncwatch within 10 s"
  t "$engine-event" 0 "$rdmaemu" event gid_change --port emu0 1
  checks=$((checks + 1))
  wait_for "$awout" 'GID_CHANGE' || fail "$engine: no GID_CHANGE from ibv_asyncwatch within 10 s"
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  checks=$((checks + 1))
  [[ $rc -eq 143 ]] || fail "$engine: ibv_asyncwatch ended with status $rc after SIGTERM, want 143"
  checks=$((checks + 1))
  [[ -e "$sock" ]] && fail "$engine: $sock is left after SIGTERM"
  # In this order, and nothing else.
  checks=$((checks + 1))
  order=$(grep -oE 'PORT_ERR|PORT_ACTIVE|GID_CHANGE' "$awout" | tr '\n' ' ')
  [[ "$order" == "PORT_ERR PORT_ACTIVE GID_CHANGE " ]] || {
    fail "$engine: events in the order '$order', want 'PORT_ERR PORT_ACTIVE GID_CHANGE'; output:"
    sed 's/^/    /' "$awout" | head -20
  }
  hasnt "$engine" "$tmp/aw-$engine.err" 'error|Segmentation|symbol lookup'
done

finish
