#!/bin/bash
# The control commands that change a port or the device, end to end: Debian's
# unmodified ibv_asyncwatch, on an InfiniBand link layer port, prints
# LID_CHANGE, SM_CHANGE, CLIENT_REREGISTER, PKEY_CHANGE, DEVICE_SPEED_CHANGE
# (speed, then width), GID_CHANGE and finally DEVICE_FATAL, in that order,
# while `rdmaemu port|gid|device` run from another process; on both engines.
# A refused value changes nothing and raises nothing.
# Debian's ibv_asyncwatch (rdma-core 44) predates DEVICE_SPEED_CHANGE in its
# name table and prints it as "unexpected (20)": 20 is the event's number.
source "$(dirname "$0")/e2e_lib.sh"
need ibv_asyncwatch stdbuf

wait_for() {  # wait_for FILE ERE: up to 10 s for a line of FILE to match
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

printf 'device emu0\nport link_layer=infiniband\n' >"$tmp/ib.conf"
want="LID_CHANGE SM_CHANGE CLIENT_REREGISTER PKEY_CHANGE DEVICE_SPEED_CHANGE DEVICE_SPEED_CHANGE GID_CHANGE DEVICE_FATAL "

for engine in uring epoll; do
  export RDMAEMU_CONTROL_DIR="$tmp/ctl-$engine"
  export RDMAEMU_SUBNET_DIR="$tmp/subnet-$engine"  # LIDs of our own
  awout="$tmp/aw-$engine.out"
  RDMAEMU_CONFIG="$tmp/ib.conf" RDMAEMU_ENGINE=$engine \
    "$rdmaemu" run -- stdbuf -oL ibv_asyncwatch >"$awout" 2>"$tmp/aw-$engine.err" &
  pid=$!
  sock="$RDMAEMU_CONTROL_DIR/$pid.sock"
  for _ in $(seq 100); do [[ -S "$sock" ]] && break; sleep 0.1; done
  checks=$((checks + 1))
  if [[ ! -S "$sock" ]]; then
    fail "$engine: ibv_asyncwatch (pid $pid) serves no control socket $sock after 10 s"
    kill "$pid"; wait "$pid"
    continue
  fi
  # step NAME EVENT OUT-ERE CMD...: runs the command, checks its output line
  # and waits for ibv_asyncwatch to print the event (one more of it).
  step() {
    local name="$1" event="$2" ere="$3"
    shift 3
    local before
    before=$(grep -cE -- "$event" "$awout")
    t "$engine-$name" 0 "$rdmaemu" "$@" && has "$engine-$name" "$tmp/$engine-$name.out" "$ere"
    checks=$((checks + 1))
    for _ in $(seq 100); do
      (( $(grep -cE -- "$event" "$awout") > before )) && return 0
      sleep 0.1
    done
    fail "$engine: no new $event from ibv_asyncwatch within 10 s after '$*'"
  }
  step lid LID_CHANGE '^emu0 port 1: LID 66 \(was [0-9]+\)$' port emu0 1 lid 0x42
  step sm SM_CHANGE '^emu0 port 1: SM LID 7 \(was 1\)$' port --pid "$pid" emu0 1 sm_lid 7
  step rereg CLIENT_REREGISTER '^emu0 port 1: clients asked to reregister$' port emu0 1 rereg
  step pkey PKEY_CHANGE '^emu0 port 1: P_Key\[1\] 0x8001 \(was 0x0000\)$' port emu0 1 pkey 1 0x8001
  speed_change='DEVICE_SPEED_CHANGE|unexpected \(20\)'
  step speed "$speed_change" '^emu0 port 1: link 4X HDR \(50.0 Gbps per lane\) \(was 4X EDR' \
    port emu0 1 speed 50.0Gbps
  step width "$speed_change" '^emu0 port 1: link 1X HDR \(50.0 Gbps per lane\) \(was 4X HDR' \
    port emu0 1 width 1X
  # Refusals: a usage error (2) naming the bad word, a device refusal (1);
  # neither raises anything (checked by the order below).
  t "$engine-badspeed" 2 "$rdmaemu" port emu0 1 speed 40Gbps &&
    has "$engine-badspeed" "$tmp/$engine-badspeed.err" "^rdmaemu port: speed must be .*not '40Gbps'$"
  t "$engine-badlid" 1 "$rdmaemu" port emu0 1 lid 0xc001 &&
    has "$engine-badlid" "$tmp/$engine-badlid.err" 'multicast LID'
  t "$engine-gid0" 1 "$rdmaemu" gid emu0 1 0 clear &&
    has "$engine-gid0" "$tmp/$engine-gid0.err" "GID\[0\] is the port's own address"
  step gid GID_CHANGE '^emu0 port 1: GID\[1\] fe80::1 \(was empty\)$' gid emu0 1 1 set fe80::1
  step fatal DEVICE_FATAL '^emu0: fatal error: every QP is in ERR and DEVICE_FATAL was raised$' device emu0 fatal
  t "$engine-dead" 1 "$rdmaemu" port emu0 1 lid 9 && has "$engine-dead" "$tmp/$engine-dead.err" 'fatal'
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  checks=$((checks + 1))
  [[ $rc -eq 143 ]] || fail "$engine: ibv_asyncwatch ended with status $rc after SIGTERM, want 143"
  # ibv_asyncwatch names the port for port events.
  has "$engine" "$awout" 'LID_CHANGE.*port 1'
  checks=$((checks + 1))
  order=$(sed -E 's/unexpected \(20\)/IBV_EVENT_DEVICE_SPEED_CHANGE/' "$awout" |
    grep -oE 'IBV_EVENT_[A-Z_]+' | sed 's/^IBV_EVENT_//' | tr '\n' ' ')
  [[ "$order" == "$want" ]] || {
    fail "$engine: events in the order '$order', want '$want'; output:"
    sed 's/^/    /' "$awout" | head -20
  }
  hasnt "$engine" "$tmp/aw-$engine.err" 'Segmentation|symbol lookup'
done

finish
