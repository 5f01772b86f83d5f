#!/usr/bin/env bash
# Debian's unmodified qperf between two processes on the emulator.
# qperf addresses its peer by LID only (it has no GID option and needs
# rdma_cm for RoCE), so both processes use an InfiniBand link-layer port,
# where the emulator routes by LID, as qperf does on real InfiniBand.
#   qperf_test.sh LIBIBVERBS
set -u
lib_src="$1"
command -v qperf >/dev/null || { echo "FAIL: qperf is not installed (tools/setup installs it)"; exit 1; }
dir=$(mktemp -d)
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
cp "$lib_src" "$dir/libibverbs.so.1"
printf 'device emu0\nport link_layer=infiniband\n' >"$dir/ib.conf"
export RDMAEMU_CONFIG="$dir/ib.conf" LD_LIBRARY_PATH="$dir"

failures=0
for engine in uring epoll; do
  port=$(( 20000 + RANDOM % 20000 ))
  RDMAEMU_ENGINE=$engine timeout 300 qperf -lp "$port" >"$dir/server.log" 2>&1 &
  server=$!
  sleep 0.5
  for t in rc_bw rc_lat uc_bw ud_bw ud_lat rc_rdma_write_bw rc_rdma_read_bw rc_compare_swap_mr rc_fetch_add_mr; do
    out=$(RDMAEMU_ENGINE=$engine timeout 30 qperf -lp "$port" -t 1 127.0.0.1 "$t" 2>&1)
    rc=$?
    result=$(grep -E '^ +(bw|latency|send_bw|msg_rate) +=' <<<"$out" | head -1 | tr -s ' ')
    if [ $rc -ne 0 ] || [ -z "$result" ] || grep -q "failed" <<<"$out"; then
      echo "FAIL: qperf $t engine=$engine (exit $rc)"; echo "$out"; failures=$((failures + 1))
    else
      echo "ok: qperf $t engine=$engine:$result"
    fi
  done
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
done
[ $failures -eq 0 ] && echo PASS || echo "$failures failure(s)"
exit $(( failures > 0 ))
