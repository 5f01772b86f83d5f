#!/usr/bin/env bash
# rping -C 100 -V under fault rules on the CM's MADs (the GSI, QP 1), set on
# the client with RDMAEMU_FAULTS, on both engines; the connection is made
# and torn down through the CM's retries (REQ, REP and DREQ are sent again
# after the response timeout, 2*64 ms + 256 ms here):
#   drop=#1@qpn=1            the first MAD the client sends (its REQ) is
#                            lost: the client logs the drop, sends the REQ
#                            again ~384 ms later and connects
#   drop=#1@qpn=1,dir=rx     the first MAD it receives (the server's REP)
#                            is lost: the server sends the REP again
#   drop=#2@qpn=1            the client's second MAD, its RTU, is lost:
#                            the server sends the REP again, the client
#                            answers it with the RTU again
#   drop=0.5@qpn=1,dir=rx    half of the MADs the client receives lost,
#                            with seeds 5, 7 and 9. Never at random on what
#                            the client sends: rping's client destroys its
#                            id right after rdma_disconnect, which ends the
#                            DREQ's retries (as the kernel's CM cancels
#                            them), so a lost DREQ leaves the server waiting
#                            for DISCONNECTED for ever, on a NIC too; and
#                            which MAD the DREQ is depends on how many were
#                            sent again before it, which timing decides.
#   dup@qpn=1,dir=both       every MAD duplicated, sent and received
# `qpn=1` filters by the local QP: the sender of a packet sent, the
# destination of a packet received (docs/faults.md), QP 1 both ways here.
#   faults_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need rping ss

# run NAME RULE: rping -C 100 -V with RULE on the client (debug log).
run() {
  local name="$1" rule="$2" a
  a=$(new_host)
  start_server "$name" "$a" rping -s -a "$a" -V -C 100
  if RDMAEMU_FAULTS="$rule" RDMAEMU_LOG=debug client "$name" 0 rping -c -a "$a" -V -C 100; then
    wait_server "$name" 0
    hasnt "$name client" "$out" 'mismatch|cma event|error [-0-9]'
    sane "$name client" "$out"
    sane "$name server" "$server_log"
    drops=$(grep -cE 'fault: drop (tx|rx) UD_SEND_ONLY' "$out")
    dups=$(grep -cE 'fault: dup x[0-9]+ (tx|rx) UD_SEND_ONLY' "$out")
    echo "ran: $engine '$rule': rping -C 100 -V in ${elapsed_ms} ms, $drops MADs dropped, $dups duplicated:"
    grep -E 'fault: (drop|dup)' "$out" | sed 's/^/    /' | head -10
    return 0
  fi
  cleanup_server; server_pid=""
  return 1
}

for engine in uring epoll; do
  name="$engine-drop-first-tx"
  if run "$name" 'drop=#1@qpn=1'; then
    has "$name" "$out" 'qp#1 fault: drop tx UD_SEND_ONLY psn 0 → qp#1 \(sending #1\)'
    checks=$((checks + 1))
    (( elapsed_ms >= 350 )) ||
      fail "$name: connected in ${elapsed_ms} ms: the first REQ was not lost (a resent REQ comes ~384 ms later)"
  fi
  name="$engine-drop-first-rx"
  if run "$name" 'drop=#1@qpn=1,dir=rx'; then
    has "$name" "$out" 'qp#1 fault: drop rx UD_SEND_ONLY psn 0 \(arrival #1\)'
    checks=$((checks + 1))
    (( elapsed_ms >= 350 )) ||
      fail "$name: connected in ${elapsed_ms} ms: the first REP was not lost (a resent REP comes ~384 ms later)"
  fi
  name="$engine-drop-rtu"
  if run "$name" 'drop=#2@qpn=1'; then
    has "$name" "$out" 'qp#1 fault: drop tx UD_SEND_ONLY psn 0 → qp#1 \(sending #2\)'
    checks=$((checks + 1))
    (( elapsed_ms >= 350 )) ||
      fail "$name: connected in ${elapsed_ms} ms: the RTU was not lost (the REP comes again ~384 ms later)"
  fi
  total=0
  for seed in 5 7 9; do
    name="$engine-drop-0.5-seed$seed"
    if run "$name" "drop=0.5@qpn=1,dir=rx;seed=$seed"; then
      total=$((total + drops))
    fi
  done
  checks=$((checks + 1))
  (( total > 0 )) || fail "$engine: drop=0.5@qpn=1,dir=rx dropped no MAD in three runs"
  name="$engine-dup"
  if run "$name" 'dup@qpn=1,dir=both'; then
    checks=$((checks + 2))
    grep -qE 'fault: dup x[0-9]+ tx UD_SEND_ONLY' "$out" || fail "$name: no MAD the client sent was duplicated"
    grep -qE 'fault: dup x[0-9]+ rx UD_SEND_ONLY' "$out" || fail "$name: no MAD the client received was duplicated"
  fi
done

finish
