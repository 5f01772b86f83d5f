#!/usr/bin/env bash
# Debian's unmodified qperf between two processes on the emulator, twice:
# - without rdma_cm qperf addresses its peer by LID only (it has no GID
#   option), so both processes use an InfiniBand link-layer port, where the
#   emulator routes by LID, as qperf does on real InfiniBand;
# - with -cm1 it connects through rdma_cm, which gives its QPs a GRH: on the
#   default RoCE v2 port, as on a RoCE NIC (qperf's UD tests build their
#   address handle from the LID alone even then, and its UC tests do not use
#   rdma_cm, so neither can run on RoCE).
# Then the RoCE runs once more under the verbs checker (RDMAEMU_CHECK=warn,
# the interposer preloaded, as `rdmaemu run --check` runs them): qperf
# leaks for real (docs/check.md), so `leak` is the only report allowed
# (and, on the server, dereg-in-flight: see below).
#   qperf_test.sh LIBIBVERBS LIBRDMACM INTERPOSER
set -u
lib_src="$1"
cm_src="$2"
interposer_src="$3"
command -v qperf >/dev/null || { echo "FAIL: qperf is not installed (tools/setup installs it)"; exit 1; }
dir=$(mktemp -d)
server=
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
cp "$lib_src" "$dir/libibverbs.so.1"
cp "$cm_src" "$dir/librdmacm.so.1"
cp "$interposer_src" "$dir/librdmaemu_interpose.so"
printf 'device emu0\nport link_layer=infiniband\n' >"$dir/ib.conf"
export RDMAEMU_CONFIG="$dir/ib.conf" LD_LIBRARY_PATH="$dir"

failures=0

# Debian's qperf 0.4.11 sends the client the RDMA CM port before its server
# child calls rdma_listen (fixed upstream in 118a571, "Fix rdmacm race"). A
# client that connects inside that window is rejected, on a NIC as here; the
# server's log then says so ("arrived before the id bound there called
# rdma_listen"). Only then is a test run again, at most twice.
#   run_cm LABEL ENV... -- QPERF-ARGS...   sets $out and $rc
race='arrived before the id bound there called rdma_listen'
run_cm() {
  local label="$1"; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local attempt before
  for attempt in 1 2 3; do
    before=$(grep -c "$race" "$dir/server.log")
    out=$(env "${envs[@]}" timeout 30 qperf "$@" 2>&1)
    rc=$?
    [ -n "${clients_log:-}" ] && echo "$out" >>"$clients_log"
    grep -q 'unexpected event from RDMA CM: Event rejected' <<<"$out" || return
    [ "$(grep -c "$race" "$dir/server.log")" -gt "$before" ] || return
    echo "note: $label: qperf's own race (port sent before rdma_listen), attempt $attempt"
  done
}
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

# RoCE through rdma_cm: the server's device takes its own address (the
# client's rdma_resolve_addr must find that host), the client the first
# free one.
unset RDMAEMU_CONFIG
for engine in uring epoll; do
  port=$(( 20000 + RANDOM % 20000 ))
  addr="127.0.$(( 100 + RANDOM % 100 )).$(( 2 + RANDOM % 200 ))"
  RDMAEMU_ADDRESS=$addr RDMAEMU_ENGINE=$engine timeout 300 qperf -lp "$port" >"$dir/server.log" 2>&1 &
  server=$!
  sleep 0.5
  # (qperf uses rdma_cm for RC only: "-cm1 set but not used in test uc_bw".)
  for t in rc_bw rc_lat rc_rdma_write_bw rc_rdma_write_lat rc_rdma_read_bw rc_rdma_read_lat \
      rc_compare_swap_mr rc_fetch_add_mr; do
    run_cm "qperf -cm1 $t engine=$engine" RDMAEMU_ENGINE=$engine -- -lp "$port" -cm1 -t 1 "$addr" "$t"
    result=$(grep -E '^ +(bw|latency|send_bw|msg_rate) +=' <<<"$out" | head -1 | tr -s ' ')
    if [ $rc -ne 0 ] || [ -z "$result" ] || grep -q "failed" <<<"$out"; then
      echo "FAIL: qperf -cm1 $t engine=$engine on RoCE (exit $rc)"; echo "$out"; failures=$((failures + 1))
    else
      echo "ok: qperf -cm1 $t engine=$engine on RoCE:$result"
    fi
  done
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
done
# Under the checker: each process reports at its exit (qperf leaks for
# real), the server's children into the server's log.
for engine in uring epoll; do
  port=$(( 20000 + RANDOM % 20000 ))
  addr="127.0.$(( 100 + RANDOM % 100 )).$(( 2 + RANDOM % 200 ))"
  RDMAEMU_CHECK=warn LD_PRELOAD="$dir/librdmaemu_interpose.so" RDMAEMU_ADDRESS=$addr \
    RDMAEMU_ENGINE=$engine timeout 300 qperf -lp "$port" >"$dir/server.log" 2>&1 &
  server=$!
  sleep 0.5
  for t in rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_lat rc_compare_swap_mr; do
    clients_log="$dir/clients.log" run_cm "qperf -cm1 $t engine=$engine under the checker" \
      RDMAEMU_CHECK=warn LD_PRELOAD="$dir/librdmaemu_interpose.so" RDMAEMU_ENGINE=$engine -- \
      -lp "$port" -cm1 -t 1 "$addr" "$t"
    result=$(grep -E '^ +(bw|latency|send_bw|msg_rate) +=' <<<"$out" | head -1 | tr -s ' ')
    if [ $rc -ne 0 ] || [ -z "$result" ] || grep -q "failed" <<<"$out"; then
      echo "FAIL: qperf -cm1 $t engine=$engine under the checker (exit $rc)"; echo "$out"
      failures=$((failures + 1))
    else
      echo "ok: qperf -cm1 $t engine=$engine under the checker:$result"
    fi
  done
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; server=
  # Every report of client and server children: leaks only, and on the
  # server dereg-in-flight too: its children never destroy their QP (they
  # destroy the listening id's, which has none) and deregister their MR
  # while the last reply they sent may not have completed yet.
  others=$( (grep -ohE 'rdmaemu-check: [a-z-]+:' "$dir/server.log" |
             grep -vE ': (leak|summary|dereg-in-flight):$'
             grep -ohE 'rdmaemu-check: [a-z-]+:' "$dir/clients.log" |
             grep -vE ': (leak|summary):$') | sort | uniq -c)
  if [ -n "$others" ]; then
    echo "FAIL: qperf under the checker, engine=$engine: reports other than leaks:"; echo "$others"
    grep -h -A6 'rdmaemu-check: ' "$dir/server.log" "$dir/clients.log" | head -40
    failures=$((failures + 1))
  fi
  rm -f "$dir/clients.log"
  grep -q 'rdmaemu-check: leak:' "$dir/server.log" ||
    { echo "FAIL: qperf under the checker, engine=$engine: its server's leaks were not reported"
      failures=$((failures + 1)); }
done

[ $failures -eq 0 ] && echo PASS || echo "$failures failure(s)"
exit $(( failures > 0 ))
