#!/bin/bash
# Path migration seen from outside, on both engines: a program of ours
# (path_target: two RC QPs on port P of a two-port emu0, the other port as
# their armed alternate path, writes flowing) runs through `rdmaemu run`;
# `rdmaemu port emu0 P down` from another process makes both QPs report
# IBV_EVENT_PATH_MIG and carry on over the other port, every write intact;
# for P = 1 and 2. Also Debian's ibv_devinfo -v on that two-port device, and
# an idle engine serving both ports' sockets uses no CPU.
# Usage: path_migration_e2e_test.sh RDMAEMU LIBIBVERBS PATH_TARGET
source "$(dirname "$0")/e2e_lib.sh"
need ibv_devinfo
prog="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"

wait_for() {  # wait_for FILE ERE: up to 10 s
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

conf="$tmp/two-ports.conf"
printf 'device emu0\nport\nport\n' >"$conf"
export RDMAEMU_CONFIG="$conf"

t devinfo 0 "$rdmaemu" run -- ibv_devinfo -v && {
  has devinfo "$out" $'^\tphys_port_cnt:\t\t\t2$'
  has devinfo "$out" $'^\t\t\t\t\tAUTO_PATH_MIG$'
  has devinfo "$out" $'^\t\tport:\t1$'
  has devinfo "$out" $'^\t\tport:\t2$'
  checks=$((checks + 1))
  n=$(grep -cE $'^\t\t\tstate:\t\t\tPORT_ACTIVE \\(4\\)$' "$out")
  [[ $n -eq 2 ]] || fail "devinfo: $n ports ACTIVE, want 2"
  checks=$((checks + 1))
  n=$(grep -cE 'GID\[  0\]:[[:space:]]+::ffff:127\.[0-9.]+, RoCE v2$' "$out")
  [[ $n -eq 2 ]] || fail "devinfo: $n RoCE v2 GIDs at index 0, want one per port"
}

for engine in uring epoll; do
  for port in 1 2; do
    other=$((3 - port))
    run="$engine-$port"
    export RDMAEMU_CONTROL_DIR="$tmp/ctl-$run"
    pout="$tmp/prog-$run.out"
    RDMAEMU_ENGINE=$engine "$rdmaemu" run -- "$prog" "$port" >"$pout" 2>"$tmp/prog-$run.err" &
    pid=$!
    checks=$((checks + 1))
    if ! wait_for "$pout" '^armed qpn [0-9]+ [0-9]+$'; then
      fail "$run: the program's QPs did not arm; stdout, stderr:"
      sed 's/^/    /' "$pout" "$tmp/prog-$run.err" | head -20
      kill "$pid"; wait "$pid"
      continue
    fi
    t "$run-down" 0 "$rdmaemu" port --pid "$pid" emu0 "$port" down &&
      has "$run-down" "$tmp/$run-down.out" "^emu0 port $port: DOWN \\(was ACTIVE\\)\$"
    wait "$pid"
    rc=$?
    checks=$((checks + 1))
    (( rc == 0 )) || {
      fail "$run: the program exited with status $rc; stdout, stderr:"
      sed 's/^/    /' "$pout" "$tmp/prog-$run.err" | head -20
    }
    has "$run" "$pout" '^port error on a port or the device$'
    has "$run" "$pout" '^path migrated on the requester$'
    has "$run" "$pout" '^path migrated on the responder$'
    has "$run" "$pout" "^migrated to port $other after [0-9]+ writes\$"
    hasnt "$run" "$pout" 'path migration request error'
    hasnt "$run" "$tmp/prog-$run.err" 'error|Segmentation|symbol lookup'
  done

  # Idle: ibv_asyncwatch holds the two-port device open (its engine serves
  # both sockets) and waits; the process may not use CPU meanwhile.
  export RDMAEMU_CONTROL_DIR="$tmp/ctl-$engine-idle"
  RDMAEMU_ENGINE=$engine "$rdmaemu" run -- ibv_asyncwatch >"$tmp/idle-$engine.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [[ -S "$RDMAEMU_CONTROL_DIR/$pid.sock" ]] && break; sleep 0.1; done
  sleep 0.5
  ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
  before=$(ticks)
  sleep 3
  after=$(ticks)
  checks=$((checks + 1))
  (( after - before <= 3 )) ||
    fail "$engine: an idle two-port engine used $((after - before)) clock ticks in 3 s"
  kill -TERM "$pid"
  wait "$pid"
done

finish
