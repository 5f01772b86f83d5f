#!/bin/bash
# The soak program without fault injection, on both engines:
#   RC: 100,000 messages (SEND, SEND_WITH_IMM, WRITE, WRITE_WITH_IMM, READ,
#       FETCH_ADD, CMP_SWP; 0 bytes to over four MTUs), every byte, the order
#       and the count checked;
#   UD: 20,000 SENDs up to the MTU, none lost on loopback, every one checked.
source "$(dirname "$0")/soak_lib.sh"

for engine in uring epoll; do
  if soak_pair "rc" "$engine" 120 --messages 100000 --seed 11; then
    [[ "$(field messages "$client_out")" == 100000 ]] || fail "rc ($engine): not 100000 messages"
  fi
  if soak_pair "ud" "$engine" 120 --mode ud --messages 20000 --seed 12; then
    [[ "$(field lost "$client_out")" == 0 ]] || fail "ud ($engine): messages lost without faults"
  fi
done

# The checks catch a wrong byte: the client alters one byte of message 5000
# (or the next SEND/WRITE); the server names the message and the offset and
# exits 1, and the client, seeing it go, exits 4 instead of hanging.
saved=$failures
soak_pair "flip" uring 60 --messages 20000 --flip-byte 5000 >/dev/null
failures=$saved
if [[ $server_rc == 1 && $client_rc == 4 ]]; then
  msg=$(grep -oE 'altered byte [0-9]+ of message [0-9]+' "$client_err")
  byte=$(awk '{print $3}' <<<"$msg"); index=$(awk '{print $6}' <<<"$msg")
  if [[ -z "$msg" ]] || ! grep -qE "MISMATCH: message $index .*offset $byte: expected" "$server_err"; then
    fail "flip: the server did not report message $index offset $byte"; cat "$client_err" "$server_err"
  fi
  grep -q "peer closed" "$client_err" || fail "flip: the client did not stop on the server's failure"
else
  fail "flip: client exit $client_rc, server exit $server_rc; want 4 and 1"; cat "$client_err" "$server_err"
fi
# A setup failure on one side ends both cleanly: the client asks for a path
# MTU above its port's (exit 4, saying so); the server sees it go (exit 4).
printf 'device emu0\nport mtu=1024\n' >"$tmp/small.conf"
saved=$failures
RDMAEMU_CONFIG="$tmp/small.conf" soak_pair "mtu" epoll 60 --mtu 2048 >/dev/null
failures=$saved
if [[ $client_rc != 4 || $server_rc != 4 ]] || ! grep -q "exceeds the port's active MTU" "$client_err"; then
  fail "--mtu above the port's MTU: client exit $client_rc, server exit $server_rc; want 4 and 4"
  cat "$client_err" "$server_err"
fi
finish
