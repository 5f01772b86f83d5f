#!/usr/bin/env bash
# Debian's unmodified ibv_xsrq_pingpong on the emulator, on both engines:
# a server and one or two clients, each its own process (its own emulated
# host), with and without completion events (-e), at several sizes, and
# over on-demand regions (-o). Each
# process opens its XRC domain through /tmp/xrc_domain (O_CREAT), sends
# over XRC_SEND QPs naming the peer's XRC SRQ, and receives through
# XRC_RECV QPs into its own; the program prints "success" at the end.
#   xsrq_pingpong_test.sh LIBIBVERBS
set -u
lib_src="$1"
program=ibv_xsrq_pingpong
if ! command -v "$program" >/dev/null; then
  echo "SKIP: $program is not installed (tools/setup installs ibverbs-utils)"
  exit 0
fi
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
cp "$lib_src" "$libdir/libibverbs.so.1"
# See pingpong_test.sh: a sanitized library needs its runtime preloaded.
preload=$(ldd "$lib_src" | awk '/lib(asan|tsan)\.so/ { print $3; exit }')

failures=0
port=$(( 20000 + RANDOM % 20000 ))
run() {  # engine, clients, args...
  local engine="$1" clients="$2"; shift 2
  port=$(( port + 1 ))
  local log="$libdir/server.$port.log"
  RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 env LD_PRELOAD="$preload" \
    "$program" -g 0 -p "$port" -c "$clients" "$@" >"$log" 2>&1 &
  local server=$!
  sleep 0.3
  local pids=() i
  for (( i = 0; i < clients; i++ )); do
    RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 env LD_PRELOAD="$preload" \
      "$program" -g 0 -p "$port" "$@" 127.0.0.1 >"$log.client$i" 2>&1 &
    pids+=($!)
  done
  local rc=0
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || rc=1
    grep -q '^success' "$log.client$i" || rc=1
  done
  wait "$server" || rc=1
  grep -q '^success' "$log" || rc=1
  if [ $rc -ne 0 ]; then
    echo "FAIL: $program engine=$engine clients=$clients args=$*"
    echo "--- server:"; cat "$log"
    for (( i = 0; i < clients; i++ )); do echo "--- client $i:"; cat "$log.client$i"; done
    failures=$(( failures + 1 ))
  else
    echo "ok: $program engine=$engine clients=$clients args=$*"
  fi
}

for engine in uring epoll; do
  for size in 1 4096 65536; do
    run "$engine" 1 -s "$size" -n 50
  done
  run "$engine" 1 -e -n 50
  run "$engine" 1 -o -n 20  # on-demand paging (xrc_odp_caps)
  run "$engine" 2 -n 20
done

[ $failures -eq 0 ] && echo "PASS" || echo "$failures failure(s)"
exit $(( failures > 0 ))
