#!/usr/bin/env bash
# tools/bench as a user runs it, briefly (--time 1): every row of the table
# is there, for the kernel and both engines, and no run FAILED. No timing
# is checked: the targets are goals, and a loaded machine misses them.
#   bench_test.sh RDMAEMU LIBIBVERBS   (tools/bench is found next to the
#   source of this script: the test is tagged local, so its runfiles link
#   to the source tree)
set -u
rdmaemu="$1" lib="$2"
bench="$(dirname "$(readlink -f "$0")")/../../tools/bench"
[[ -x "$bench" ]] || { echo "FAIL: no tools/bench at $bench"; exit 1; }
for p in qperf ib_send_bw ibv_rc_pingpong; do
  command -v "$p" >/dev/null || { echo "SKIP: $p is not installed (tools/setup)"; exit 0; }
done
out="${TEST_TMPDIR:-$(mktemp -d)}/bench.out"
"$bench" --no-build --rdmaemu "$rdmaemu" --lib "$(dirname "$lib")" --time 1 >"$out" 2>&1
rc=$?
cat "$out"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
(( rc == 0 )) || fail "tools/bench exited $rc"
grep -qE "^[a-z_]+ +[a-z]+ +FAILED" "$out" && fail "a row FAILED"
for row in tcp_bw udp_bw udp_bw_2k udp_rate_64 tcp_lat udp_lat; do
  grep -qE "^$row +kernel +[0-9.]+ " "$out" || fail "no kernel row $row with a result"
done
for engine in uring epoll; do
  for row in rc_bw rc_lat rc_rdma_write_bw rc_rdma_read_bw rc_rate_64 rc_lat_poll uc_bw ud_bw ud_lat \
             rc_compare_swap_mr rc_fetch_add_mr rc_rdma_write_lat rc_rdma_read_lat idle_cpu; do
    grep -qE "^$row +$engine +[0-9.]+ " "$out" || fail "no $engine row $row with a result"
  done
  for ratio in "rc_bw / tcp_bw" "rc_rdma_write_bw / tcp_bw" "rc_rdma_read_bw / tcp_bw" \
               "uc_bw / udp_bw \(32 KiB\)" "ud_bw / udp_bw \(2 KiB\)" "rc_lat / udp_lat" \
               "rc_lat_poll / udp_lat" "ud_lat / udp_lat" "rc_rdma_write_lat / udp_lat" \
               "rc_rate_64 / udp_rate_64" "idle CPU %"; do
    grep -qE "^$ratio +$engine +[0-9.]+ .*(MET|MISSED)" "$out" || fail "no $engine ratio '$ratio'"
  done
done
grep -qE '^machine: [0-9]+ CPUs' "$out" || fail "no machine line"

# --rounds: each row the median of its rounds, which it lists.
out2="${out%.out}.rounds.out"
"$bench" --no-build --rdmaemu "$rdmaemu" --lib "$(dirname "$lib")" --time 1 --rounds 3 \
  --engine uring --only udp_lat,rc_lat >"$out2" 2>&1
rc=$?
cat "$out2"
(( rc == 0 )) || fail "tools/bench --rounds 3 exited $rc"
for row in "udp_lat +kernel" "rc_lat +uring"; do
  line=$(grep -E "^$row +[0-9.]+ " "$out2")
  [[ -n "$line" ]] || { fail "--rounds 3: no row $row"; continue; }
  # the value, then the three rounds' values: the value is their median
  python3 - "$line" <<'PY' || fail "--rounds 3: row $row is not the median of its rounds: $line"
import re, sys
line = sys.argv[1]
value = float(line.split()[2])
rounds = [float(v) for v in re.search(r"\[rounds: ([0-9. ]+)\]", line).group(1).split()]
sys.exit(0 if len(rounds) == 3 and abs(sorted(rounds)[1] - value) < 1e-6 else 1)
PY
done
grep -q "median of 3 rounds" "$out2" || fail "--rounds 3: the table does not say its rows are medians"
grep -qE "^rc_lat / udp_lat +uring +[0-9.]+ .*(MET|MISSED)" "$out2" || fail "--rounds 3: no ratio"
(( failures == 0 )) && echo PASS || echo "$failures failure(s)"
exit $(( failures > 0 ))
