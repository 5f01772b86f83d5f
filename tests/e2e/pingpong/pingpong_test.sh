#!/usr/bin/env bash
# Debian's unmodified pingpong programs, server and client in two processes
# on the emulator, on both engines, with and without completion events
# (-e), at sizes from 1 byte to 64 KiB (UD up to the MTU), validating the
# buffer (-c).
#   pingpong_test.sh LIBIBVERBS PROGRAM [EXTRA_ARGS...]
set -u
lib_src="$1"
program="$2"
shift 2
extra=("$@")
if ! command -v "$program" >/dev/null; then
  echo "SKIP: $program is not installed (tools/setup installs ibverbs-utils)"
  exit 0
fi
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
cp "$lib_src" "$libdir/libibverbs.so.1"

# Built with --config=asan or tsan (tools/test's sanitizer runs), the
# library needs its sanitizer's runtime loaded first, which an unmodified
# program does not do: preload it into the program alone (`env` after
# `timeout`), so Debian's binaries run on the sanitized library and a
# sanitizer report fails the run (exit status 1 for ASan, 66 for TSan).
preload=$(ldd "$lib_src" | awk '/lib(asan|tsan)\.so/ { print $3; exit }')
[ -n "$preload" ] && echo "the library is sanitized: preloading $preload"

case "$program" in
  ibv_ud_pingpong) sizes=(1 100 1024 2048 4096) ;;
  *) sizes=(1 100 4096 65536) ;;
esac

failures=0
port=$(( 20000 + RANDOM % 20000 ))
iters=200
run_pair() {  # engine, args...
  local engine="$1"; shift
  port=$(( port + 1 ))
  # Past ports another test's sockets hold (listening, or in TIME_WAIT,
  # where a server without SO_REUSEADDR cannot listen): tests run side by
  # side and pick their ports from the same range.
  while ss -Htan "( sport = :$port )" 2>/dev/null | grep -q .; do port=$(( port + 1 )); done
  local log="$libdir/server.$port.log"
  RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 env LD_PRELOAD="$preload" \
    "$program" -g 0 -p "$port" -n "$iters" "$@" >"$log" 2>&1 &
  local server=$!
  sleep 0.3
  local out
  out=$(RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 env LD_PRELOAD="$preload" \
    "$program" -g 0 -p "$port" -n "$iters" "$@" 127.0.0.1 2>&1)
  local client_rc=$?
  wait "$server"
  local server_rc=$?
  if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ] || ! grep -q "$iters iters in" <<<"$out" \
     || grep -q "invalid data" "$log"; then
    echo "FAIL: $program engine=$engine args=$* client=$client_rc server=$server_rc"
    echo "--- client:"; echo "$out"; echo "--- server:"; cat "$log"
    failures=$(( failures + 1 ))
  else
    echo "ok: $program engine=$engine args=$* ($(grep 'usec/iter' <<<"$out" | tail -1))"
  fi
}

for engine in uring epoll; do
  for size in "${sizes[@]}"; do
    run_pair "$engine" -s "$size" -c "${extra[@]}"
  done
  run_pair "$engine" -e -s 2048 -c "${extra[@]}"
done

# Without -g the address has no GRH: refused on RoCE, as real RoCE refuses it.
out=$(LD_LIBRARY_PATH="$libdir" timeout 20 env LD_PRELOAD="$preload" "$program" -p $(( port + 1 )) 127.0.0.9 2>&1)
if [ $? -eq 0 ]; then
  echo "FAIL: $program without -g succeeded; RoCE needs a GRH"; failures=$(( failures + 1 ))
fi

[ $failures -eq 0 ] && echo "PASS" || echo "$failures failure(s)"
exit $(( failures > 0 ))
