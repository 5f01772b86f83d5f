#!/bin/bash
# The soak program's RC mode under 5% drop, 2% duplication, 5% reordering and
# 1% corruption (issue 5): 100,000 messages of random sizes (SEND, WRITE,
# READ, atomics), every byte, the order and the count verified, on both
# engines. The device counters each side prints prove the faults happened:
# the fault rules' own counts (fault_*) and what they caused.
# Numbers (retransmissions, timeouts, time) and what they cost: docs/soak.md.
source "$(dirname "$0")/soak_lib.sh"

# counter NAME FILE: the value of a counter on a "soak ... counters:" line.
counter() { grep -E '^soak (client|server) counters:' "$2" | grep -oE "(^| )$1=[0-9]+" | head -1 | cut -d= -f2; }

rc_faults='drop=0.05,dup=0.02,reorder=0.05,corrupt=0.01,seed=7'
for engine in uring epoll; do
  export RDMAEMU_FAULTS="$rc_faults"
  if soak_pair "rc-faults-$engine" "$engine" 300 --messages 100000 --seed 21 --qp-timeout 10; then
    [[ "$(field messages "$client_out")" == 100000 ]] || fail "rc ($engine): not 100000 messages"
    retrans=$(( $(counter retransmissions "$client_out") + $(counter retransmissions "$server_out") ))
    icrc=$(( $(counter dropped_icrc "$client_out") + $(counter dropped_icrc "$server_out") ))
    dups=$(( $(counter duplicates "$client_out") + $(counter duplicates "$server_out") ))
    echo "rc ($engine) under $rc_faults: ${elapsed}s, retransmissions=$retrans dropped_icrc=$icrc duplicate_requests=$dups"
    # What the rules did to the packets each side sent, summed.
    faults=""
    for kind in dropped duplicated reordered corrupted; do
      n=$(( $(counter "fault_$kind" "$client_out") + $(counter "fault_$kind" "$server_out") ))
      faults+=" $kind=$n"
      (( n > 0 )) || fail "rc ($engine): fault_$kind is 0 under $rc_faults"
    done
    echo "    packets the fault rules changed:$faults"
    grep -E '^soak (client|server) faults:' "$client_out" "$server_out" | sed 's/^/    /'
    (( retrans > 0 )) || fail "rc ($engine): no retransmission under 5% drop: RDMAEMU_FAULTS ignored?"
    (( icrc > 0 )) || fail "rc ($engine): no ICRC drop under 1% corruption"
    (( dups > 0 )) || fail "rc ($engine): no duplicate request under 2% duplication"
  fi
done
unset RDMAEMU_FAULTS
finish
