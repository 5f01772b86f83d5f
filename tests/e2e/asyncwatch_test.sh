#!/bin/bash
# Debian's ibv_asyncwatch opens emu0, prints the async event fd and waits on
# it; it must start and wait quietly until killed.
source "$(dirname "$0")/e2e_lib.sh"
need ibv_asyncwatch stdbuf

out="$tmp/asyncwatch.out"
err="$tmp/asyncwatch.err"
# stdbuf: ibv_asyncwatch leaves stdout block-buffered, and we kill it.
"$rdmaemu" run -- stdbuf -oL ibv_asyncwatch >"$out" 2>"$err" &
pid=$!
sleep 1
checks=$((checks + 1))
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  [[ $rc -eq 143 ]] || fail "asyncwatch: ended with status $rc after SIGTERM, want 143"
else
  wait "$pid"
  fail "asyncwatch: exited by itself with status $? within a second; stderr:"
  sed 's/^/    /' "$err" | head -10
fi
has asyncwatch "$out" '^emu0: async event FD [0-9]+$'
hasnt asyncwatch "$err" 'error|Segmentation|symbol lookup'

finish
