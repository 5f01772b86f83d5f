#!/bin/bash
# `rdmaemu list` and `rdmaemu event` on the QP, CQ, SRQ and WQ of a running verbs
# program (event_target, run through `rdmaemu run`), on both engines: the
# program's ibv_get_async_event returns each event naming its own object.
# Usage: event_test.sh RDMAEMU LIBIBVERBS EVENT_TARGET
source "$(dirname "$0")/e2e_lib.sh"
prog="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"

wait_for() {  # wait_for FILE ERE: up to 10 s
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

for engine in uring epoll; do
  export RDMAEMU_CONTROL_DIR="$tmp/ctl-$engine"
  pout="$tmp/prog-$engine.out"
  RDMAEMU_ENGINE=$engine "$rdmaemu" run -- "$prog" 4 >"$pout" 2>"$tmp/prog-$engine.err" &
  pid=$!
  checks=$((checks + 1))
  if ! wait_for "$pout" '^ready qpn [0-9]+ wqn [0-9]+$'; then
    fail "$engine: the program did not get ready; stderr:"
    sed 's/^/    /' "$tmp/prog-$engine.err" | head
    kill "$pid"; wait "$pid"
    continue
  fi
  qpn=$(sed -n 's/^ready qpn \([0-9]*\) .*/\1/p' "$pout")
  hex=$(printf '0x%06x' "$qpn")
  wqn=$(sed -n 's/^ready .* wqn //p' "$pout")
  wqhex=$(printf '0x%06x' "$wqn")
  t "$engine-list" 0 "$rdmaemu" list --pid "$pid" && {
    has "$engine-list" "$tmp/$engine-list.out" "^process $pid event_target\$"
    has "$engine-list" "$tmp/$engine-list.out" "^emu0 qp $qpn \\($hex\\) RC RESET\$"
    has "$engine-list" "$tmp/$engine-list.out" '^emu0 cq 1$'
    has "$engine-list" "$tmp/$engine-list.out" '^emu0 srq 1$'
    has "$engine-list" "$tmp/$engine-list.out" "^emu0 wq $wqn \\($wqhex\\) RESET\$"
  }
  t "$engine-qp" 0 "$rdmaemu" event --pid "$pid" qp_fatal --qp "$hex" &&
    has "$engine-qp" "$tmp/$engine-qp.out" "^emu0 qp $qpn: raised IBV_EVENT_QP_FATAL\$"
  t "$engine-cq" 0 "$rdmaemu" event --pid "$pid" IBV_EVENT_CQ_ERR --cq 1
  t "$engine-srq" 0 "$rdmaemu" event --pid "$pid" srq_limit_reached --srq 1 --device emu0
  t "$engine-wq" 0 "$rdmaemu" event --pid "$pid" wq_fatal --wq "$wqn" &&
    has "$engine-wq" "$tmp/$engine-wq.out" "^emu0 wq $wqn: raised IBV_EVENT_WQ_FATAL\$"
  wait "$pid"
  rc=$?
  checks=$((checks + 1))
  (( rc == 0 )) || fail "$engine: the program exited with status $rc"
  has "$engine" "$pout" '^local work queue catastrophic error on our qp$'
  has "$engine" "$pout" '^CQ error on our cq$'
  has "$engine" "$pout" '^SRQ limit reached on our srq$'
  has "$engine" "$pout" '^WQ fatal on our wq$'
  checks=$((checks + 1))
  [[ -e "$RDMAEMU_CONTROL_DIR/$pid.sock" ]] && fail "$engine: the socket is left after exit"
done

finish
