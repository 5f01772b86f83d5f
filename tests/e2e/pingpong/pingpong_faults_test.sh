#!/usr/bin/env bash
# Debian's unmodified ibv_rc_pingpong and ibv_srq_pingpong, validating every
# buffer (-c), pass while the emulator drops, duplicates, reorders and
# corrupts their packets (RDMAEMU_FAULTS), on both engines: RC's
# retransmission hides the faults from the programs.
#   pingpong_faults_test.sh LIBIBVERBS
# The faults act on the server-to-client direction only (the server's rules
# on what it sends, the client's on what it receives), and never lose an
# ACK: the ACK of each side's last SEND is the last packet of the run, and
# whoever sends it exits right after, so a lost one could never be answered
# again and the other side would fail with RETRY_EXC_ERR (on real hardware
# too; a client failed so once on uring when ACKs were dropped). So the
# server's SENDs are dropped, duplicated, reordered and corrupted, on the
# server's way out and again on the client's way in; its ACKs and NAKs are
# duplicated and reordered on the client's way in (held at most 1 ms, in a
# process that is still waiting for them). RC under ACK loss is
# soak_rc_faults_test's job.
# The debug log proves the faults happened: each run must show a transport
# timeout (a lost packet) and an ICRC drop (a corrupted one), else the test
# fails as if RDMAEMU_FAULTS had been ignored.
set -u
lib_src="$1"
for p in ibv_rc_pingpong ibv_srq_pingpong; do
  command -v "$p" >/dev/null || { echo "FAIL: $p is not installed (tools/setup installs ibverbs-utils)"; exit 1; }
done
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
cp "$lib_src" "$libdir/libibverbs.so.1"

faults='drop=0.05,dup=0.02,reorder=0.05,corrupt=0.01'
server_faults="seed=5;$faults@dir=tx,op=SEND"
client_faults="seed=5;$faults@dir=rx,op=SEND;dup=0.02,reorder=0.05@dir=rx,op=ACK"
failures=0
port=$(( 20000 + RANDOM % 20000 ))
iters=300
run_pair() {  # program, engine, args...
  local program="$1" engine="$2"; shift 2
  port=$(( port + 1 ))
  local slog="$libdir/server.$port.log" clog="$libdir/client.$port.log"
  RDMAEMU_FAULTS=$server_faults RDMAEMU_LOG=debug RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 120 \
    "$program" -g 0 -p "$port" -n "$iters" "$@" >"$slog" 2>&1 &
  local server=$!
  sleep 0.3
  RDMAEMU_FAULTS=$client_faults RDMAEMU_LOG=debug RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 120 \
    "$program" -g 0 -p "$port" -n "$iters" "$@" 127.0.0.1 >"$clog" 2>&1
  local client_rc=$?
  wait "$server"
  local server_rc=$?
  local timeouts icrc
  timeouts=$(cat "$slog" "$clog" | grep -c 'transport timeout, retransmitting')
  icrc=$(cat "$slog" "$clog" | grep -ci 'dropped a packet from .*ICRC')
  if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ] || ! grep -q "$iters iters in" "$clog" \
     || grep -q "invalid data" "$slog" "$clog"; then
    echo "FAIL: $program engine=$engine args=$* client=$client_rc server=$server_rc"
    # The programs' stdout reaches the file only at exit, after everything
    # they wrote to stderr: show their own error lines and the emulator's
    # warnings first, then the last debug lines before the failure.
    for side in client server; do
      local log=$clog; [ $side = server ] && log=$slog
      echo "--- $side: errors and warnings:"
      grep -v -E ' (debug|info):|address:|^seed=|matched [0-9]+ packets|^$' "$log" | head -20
      echo "--- $side: last debug lines:"
      grep ' debug:' "$log" | tail -15
    done
    failures=$(( failures + 1 ))
  elif [ "$timeouts" -eq 0 ] || [ "$icrc" -eq 0 ]; then
    echo "FAIL: $program engine=$engine args=$*: passed, but with $timeouts transport timeouts and $icrc ICRC drops: RDMAEMU_FAULTS ignored?"
    failures=$(( failures + 1 ))
  else
    echo "ok: $program engine=$engine args=$* under $faults (server SENDs; ACKs duplicated and reordered): $timeouts transport timeouts, $icrc ICRC drops ($(grep 'usec/iter' "$clog" | tail -1))"
  fi
}

for engine in uring epoll; do
  for program in ibv_rc_pingpong ibv_srq_pingpong; do
    run_pair "$program" "$engine" -s 4096 -c
  done
done

[ $failures -eq 0 ] && echo "PASS" || echo "$failures failure(s)"
exit $(( failures > 0 ))
