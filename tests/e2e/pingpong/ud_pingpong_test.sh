#!/usr/bin/env bash
# Debian's unmodified ibv_ud_pingpong, server and client in two processes on
# the emulator, on both engines, with and without completion events, at
# sizes from 1 byte to the MTU, with buffer validation (-c).
set -u
lib_src="$1"
if ! command -v ibv_ud_pingpong >/dev/null; then
  echo "SKIP: ibv_ud_pingpong is not installed (tools/setup installs ibverbs-utils)"
  exit 0
fi
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
cp "$lib_src" "$libdir/libibverbs.so.1"

failures=0
port=$(( 20000 + RANDOM % 20000 ))
run_pair() {  # engine, extra args...
  local engine="$1"; shift
  port=$(( port + 1 ))
  local log="$libdir/server.$port.log"
  RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 \
    ibv_ud_pingpong -g 0 -p "$port" -n 200 "$@" >"$log" 2>&1 &
  local server=$!
  sleep 0.3
  local out
  out=$(RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 \
    ibv_ud_pingpong -g 0 -p "$port" -n 200 "$@" 127.0.0.1 2>&1)
  local client_rc=$?
  wait "$server"
  local server_rc=$?
  if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ] || ! grep -q "200 iters in" <<<"$out" \
     || grep -q "invalid data" "$log"; then
    echo "FAIL: engine=$engine args=$* client=$client_rc server=$server_rc"
    echo "--- client:"; echo "$out"; echo "--- server:"; cat "$log"
    failures=$(( failures + 1 ))
  else
    echo "ok: engine=$engine args=$* ($(grep 'usec/iter' <<<"$out"))"
  fi
}

for engine in uring epoll; do
  for size in 1 100 1024 2048 4096; do
    run_pair "$engine" -s "$size" -c
  done
  run_pair "$engine" -e -s 2048 -c
done

# Without -g the address has no GRH: refused on RoCE, as real RoCE refuses it.
out=$(LD_LIBRARY_PATH="$libdir" timeout 20 ibv_ud_pingpong -p $(( port + 1 )) 127.0.0.9 2>&1)
if [ $? -eq 0 ]; then
  echo "FAIL: ibv_ud_pingpong without -g succeeded; RoCE needs a GRH"; failures=$(( failures + 1 ))
fi

[ $failures -eq 0 ] && echo "PASS" || echo "$failures failure(s)"
exit $(( failures > 0 ))
