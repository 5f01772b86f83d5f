#!/usr/bin/env bash
# `rdmaemu top` and `rdmaemu stats --watch` on a running ibv_rc_pingpong
# pair (Debian's, through `rdmaemu run`): top's second reading shows the
# traffic as rates on the device and on the QP (RC, RTS); stats --watch
# prints a reading every second; with no program running top says so
# (status 1); bad arguments are usage errors (status 2).
#   top_test.sh RDMAEMU
set -u
tool="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export RDMAEMU_CONTROL_DIR="$tmp/control"  # only this test's programs
mkdir -p -m 0700 "$RDMAEMU_CONTROL_DIR"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

checks=$((checks + 1))
"$tool" top --count 1 >"$tmp/none.out" 2>"$tmp/none.err"
rc=$?
[[ $rc -eq 1 ]] && grep -q 'no running rdmaemu process' "$tmp/none.err" ||
  fail "top with nothing running: status $rc, $(cat "$tmp/none.err")"
for bad in "--interval 0" "--count x" "--frobnicate"; do
  checks=$((checks + 1))
  # shellcheck disable=SC2086
  "$tool" top $bad >/dev/null 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || fail "top $bad: status $rc, want 2"
done

port=$(( 20000 + RANDOM % 20000 ))
"$tool" run -- ibv_rc_pingpong -g 0 -p "$port" -n 400000 >"$tmp/server.out" 2>&1 &
server=$!  # rdmaemu run execs: this is the program's pid
sleep 0.5
"$tool" run -- ibv_rc_pingpong -g 0 -p "$port" -n 400000 127.0.0.1 >"$tmp/client.out" 2>&1 &
client=$!
sleep 1

checks=$((checks + 1))
if "$tool" top --pid "$server" --count 2 >"$tmp/top.out" 2>&1; then
  # The second reading's device line and QP line, with a non-zero TX rate.
  second=$(awk '/^rdmaemu top/{n++} n==2' "$tmp/top.out")
  dev_rate=$(awk -v pid="$server" '$1==pid && $2=="ibv_rc_pingpong" && $3=="emu0" {print $4}' <<<"$second")
  qp_line=$(awk -v pid="$server" '$1==pid && $2=="emu0" && $4=="RC" && $5=="RTS"' <<<"$second")
  [[ -n "$dev_rate" && "$dev_rate" -gt 0 ]] ||
    { fail "top: no TX rate on the server's emu0 in the second reading:"; sed 's/^/    /' "$tmp/top.out"; }
  [[ -n "$qp_line" && "$(awk '{print $6}' <<<"$qp_line")" -gt 0 ]] ||
    { fail "top: no RC RTS QP with a TX rate in the second reading:"; sed 's/^/    /' "$tmp/top.out"; }
else
  fail "top --pid $server --count 2 failed:"; sed 's/^/    /' "$tmp/top.out"
fi

checks=$((checks + 1))
timeout 2.6 "$tool" stats --watch --pid "$server" >"$tmp/watch.out" 2>&1
readings=$(grep -c '^-- rdmaemu stats at ' "$tmp/watch.out")
sent=$(grep -c '^packets_sent [0-9]' "$tmp/watch.out")
(( readings >= 2 && sent == readings )) ||
  { fail "stats --watch: $readings readings, $sent packets_sent lines in 2.6 s:"; head -20 "$tmp/watch.out" | sed 's/^/    /'; }

# rdmaemu trace: the server's packet lines for a second, while its own
# stderr stays quiet; the file it wrote them to is gone afterwards.
checks=$((checks + 1))
export TMPDIR="$tmp"
"$tool" trace --pid "$server" --seconds 1 >"$tmp/trace.out" 2>"$tmp/trace.err"
rc=$?
pkts=$(grep -cE "^rdmaemu\[$server\] trace: emu0 qp#[0-9]+ (rx|tx) RC_" "$tmp/trace.out")
(( rc == 0 && pkts > 10 )) ||
  { fail "trace: status $rc, $pkts packet lines:"; head -5 "$tmp/trace.out" "$tmp/trace.err" | sed 's/^/    /'; }
checks=$((checks + 1))
if grep -q 'trace:' "$tmp/server.out"; then fail "trace: the program's own stderr got trace lines"; fi
checks=$((checks + 1))
if ls "$tmp"/rdmaemu-trace-* >/dev/null 2>&1; then fail "trace left its file behind"; fi
checks=$((checks + 1))
"$tool" trace --pid "$server" --level loud >/dev/null 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "trace --level loud: status $rc, want 2"

kill "$client" "$server" 2>/dev/null
wait 2>/dev/null
echo "$checks checks, $failures failures"
[[ $failures -eq 0 ]]
