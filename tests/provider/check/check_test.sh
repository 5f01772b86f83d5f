#!/bin/bash
# The verbs checker end to end: each mistake program, run through
# `rdmaemu run --check=error`, gets a report whose first line is
# "rdmaemu-check: KIND: ...", is not crashed (no signal status), exits 86,
# and under --check=warn exits with its own status; --check-report writes
# JSON lines; the correct programs print nothing and exit 0; without
# --check the mistakes print no report.
# Usage: check_test.sh ENGINE RDMAEMU LIBIBVERBS PROGRAM...
set -u
engine="$1" tool="$2" lib="$3"
shift 3
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/check_test.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

declare -A kind=(
  [ack_mismatch]=ack-mismatch
  [cm_ack_mismatch]=ack-mismatch
  [cm_leak]=leak
  [cq_too_small]=cq-too-small
  [dealloc_mw_in_flight]=dereg-in-flight
  [dereg_in_flight]=dereg-in-flight
  [dereg_in_flight_bind]=dereg-in-flight
  [dereg_in_flight_ex]=dereg-in-flight
  [freed_registered_memory]=freed-registered-memory
  [leak]=leak
  [send_buffer_changed]=send-buffer-changed
  [send_buffer_changed_ex]=send-buffer-changed
  [unarmed_wait]=unarmed-wait
  [unsignaled_sq_full]=unsignaled-sq-full
  [unsignaled_sq_full_ex]=unsignaled-sq-full
  [use_after_destroy]=use-after-destroy
)

run() {  # run MODE PROGRAM OUT ERR [extra options]: the exit status
  local mode="$1" prog="$2" out="$3" err="$4"
  shift 4
  timeout 60 "$tool" run --lib "$lib" --engine "$engine" $mode "$@" -- "$prog" >"$out" 2>"$err"
}

for prog in "$@"; do
  name="$(basename "$prog")"
  if [[ "$name" == correct || "$name" == correct_ex || "$name" == correct_dm || "$name" == cm_correct ]]; then
    checks=$((checks + 1))
    run --check=error "$prog" "$tmp/out" "$tmp/err"
    rc=$?
    [[ $rc -eq 0 ]] || fail "correct: exit status $rc under --check=error"
    [[ -s "$tmp/err" ]] && { fail "correct: printed on stderr:"; sed 's/^/    /' "$tmp/err"; }
    continue
  fi
  want="${kind[$name]}"
  checks=$((checks + 1))
  run --check=error "$prog" "$tmp/out" "$tmp/err" --check-report "$tmp/$name.json"
  rc=$?
  first="$(grep -m1 '^rdmaemu-check: ' "$tmp/err")"
  if [[ "$first" != "rdmaemu-check: $want: "* ]]; then
    fail "$name: first report line is '$first', want 'rdmaemu-check: $want: ...'"
    sed 's/^/    /' "$tmp/err" | head -30
  fi
  [[ $rc -eq 86 ]] || fail "$name: exit status $rc under --check=error, want 86"
  grep -q "^rdmaemu-check: summary: " "$tmp/err" || fail "$name: no summary line"
  # The stack names the program's own source line.
  grep -q "^    #[0-9]* .* .*$name\.c:[0-9]*$" "$tmp/err" ||
    { fail "$name: no frame of $name.c in the report"; sed 's/^/    /' "$tmp/err" | head -30; }
  grep -q "\"kind\":\"$want\"" "$tmp/$name.json" 2>/dev/null || fail "$name: no $want JSON line"
  if [[ "$name" == leak ]]; then
    # One report per kind it left, the memory window among them.
    for left in "QP" "CQ" "MR" "MW" "PD" "context"; do
      grep -qE "^rdmaemu-check: leak: [0-9]+ $left(s)? still alive" "$tmp/err" ||
        { fail "leak: no leak report of its $left"; sed 's/^/    /' "$tmp/err" | grep '^    rdmaemu-check'; }
    done
  fi
  if [[ "$name" == cm_leak ]]; then
    # The id and the channel, each with where it was made; never the
    # context or PD librdmacm keeps for the device.
    line="$(grep -m1 "^rdmaemu-check: leak: 2 RDMA CM object(s) " "$tmp/err")"
    [[ "$line" == *"cm id "* && "$line" == *"event channel fd "* ]] ||
      { fail "cm_leak: the report does not name the id and the channel"; sed 's/^/    /' "$tmp/err" | head; }
    grep -qE "^rdmaemu-check: leak: .*(context|PD)" "$tmp/err" &&
      { fail "cm_leak: librdmacm's own context or PD reported as a leak"; sed 's/^/    /' "$tmp/err" | head; }
  fi
  checks=$((checks + 1))
  run --check=warn "$prog" "$tmp/out" "$tmp/err"
  rc=$?
  [[ $rc -eq 0 ]] || { fail "$name: exit status $rc under --check=warn, want the program's 0"; sed 's/^/    /' "$tmp/err" | head; }
  grep -q "^rdmaemu-check: $want: " "$tmp/err" || fail "$name: no $want report under --check=warn"
  checks=$((checks + 1))
  if [[ "$name" != use_after_destroy ]]; then  # without the checker it may crash
    run "" "$prog" "$tmp/out" "$tmp/err"
    grep -q "rdmaemu-check" "$tmp/err" && fail "$name: a report without --check"
  fi
  cp "$tmp/err" "${TEST_UNDECLARED_OUTPUTS_DIR:-$tmp}/$name.report" 2>/dev/null
done
echo "check_test ($engine): $checks checks, $failures failed"
[[ $failures -eq 0 ]]
