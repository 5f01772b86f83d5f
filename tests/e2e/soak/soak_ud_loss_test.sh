#!/bin/bash
# The soak program's UD mode under 10% loss (issue 5), on both engines:
# messages are lost but none is ever delivered corrupted (the program
# verifies every message it receives). A run that loses nothing means
# RDMAEMU_FAULTS was ignored, and fails. Every packet the client's rules
# dropped (its fault_dropped counter) is a message lost: UD never resends.
source "$(dirname "$0")/soak_lib.sh"

# counter NAME FILE: the value of a counter on a "soak ... counters:" line.
counter() { grep -E '^soak (client|server) counters:' "$2" | grep -oE "(^| )$1=[0-9]+" | head -1 | cut -d= -f2; }

for engine in uring epoll; do
  export RDMAEMU_FAULTS='drop=0.1,seed=3'
  if soak_pair "ud-loss-$engine" "$engine" 120 --mode ud --messages 20000 --seed 22; then
    lost=$(field lost "$client_out")
    dropped=$(counter fault_dropped "$client_out")
    echo "ud ($engine) under drop=0.1: lost $lost of 20000 (the fault rules dropped $dropped), every received message verified"
    (( lost > 0 )) || fail "ud ($engine): nothing lost under 10% drop: RDMAEMU_FAULTS ignored?"
    (( dropped > 0 && dropped <= lost )) || fail "ud ($engine): the rules dropped $dropped packets, $lost messages were lost"
    (( lost < 10000 )) || fail "ud ($engine): lost $lost of 20000 under 10% drop"
  fi
done
unset RDMAEMU_FAULTS
finish
