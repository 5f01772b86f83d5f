# Shared by the RDMA CM end-to-end tests: sourced, not run. Each test is
# called as `TEST.sh RDMAEMU LIBRDMACM` and runs Debian's unmodified
# rdmacm-utils programs through `rdmaemu run --lib DIR`, DIR being the
# built librdmacm.so.1's directory (libibverbs.so.1 sits beside it), so the
# libraries under test are the ones Bazel built for this test.
#
# Every program is its own emulated host: a server binds (rdma_bind_addr)
# an address of 127/8 and its device takes it; a client's device takes the
# first free address. Addresses are random in 127.100-199.x.y, so tests
# running at once (and other tests' hosts on 127.0.0.x) never share one.
set -u
rdmaemu="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
libdir="$(cd "$(dirname "$2")" && pwd)"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
server_pid=""
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# shellcheck source=tests/e2e/rping_race.sh
source "$(dirname "${BASH_SOURCE[0]}")/../rping_race.sh"

need() {
  for p in "$@"; do
    if ! command -v "$p" >/dev/null; then
      echo "FAIL: $p is not installed (tools/setup installs rdmacm-utils and tshark)"
      exit 1
    fi
  done
}

# A fresh host address nobody uses.
new_host() {
  local a
  for _ in $(seq 50); do
    a="127.$((100 + RANDOM % 100)).$((RANDOM % 256)).$((2 + RANDOM % 250))"
    ss -Hlun "src = $a" 2>/dev/null | grep -q . || break
  done
  echo "$a"
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# emu CMD...: CMD through `rdmaemu run` on $engine (set by the caller).
emu() { "$rdmaemu" run --lib "$libdir" --engine "$engine" -- "$@"; }

# start_server NAME ADDR CMD...: CMD in the background (60 s timeout),
# stdout and stderr in $tmp/NAME.server; returns once ADDR's device has
# bound its UDP port (rdma_bind_addr), and a little more for rdma_listen.
start_server() {
  local name="$1" addr="$2"
  shift 2
  server_log="$tmp/$name.server"
  timeout 60 "$rdmaemu" run --lib "$libdir" --engine "$engine" -- "$@" >"$server_log" 2>&1 &
  server_pid=$!
  for _ in $(seq 100); do
    ss -Hlun "src = $addr:4791" 2>/dev/null | grep -q . && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  sleep 0.2
}

# wait_server NAME WANT: the server's exit status is WANT.
wait_server() {
  checks=$((checks + 1))
  wait "$server_pid"
  local rc=$?
  server_pid=""
  # rping's own teardown race (tests/e2e/rping_race.sh).
  if [[ "$2" == 0 ]] && rping_lost_teardown_race "$rc" "$server_log"; then
    echo "note: $1: the server lost rping's teardown race (rdma_get_cm_event after its own rdma_destroy_event_channel); counted as passed"
    return 0
  fi
  if [[ "$rc" != "$2" ]]; then
    fail "$1: server exit status $rc, want $2; its output:"
    sed 's/^/    /' "$server_log" | head -30
    return 1
  fi
}

# stop_server NAME: a server that runs until killed (cmtime) is still
# running, then is stopped.
stop_server() {
  checks=$((checks + 1))
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid"
    fail "$1: server exited early with status $?; its output:"
    sed 's/^/    /' "$server_log" | head -30
  else
    kill -TERM "$server_pid"
    wait "$server_pid"
  fi
  server_pid=""
}

# client NAME WANT CMD...: CMD through rdmaemu run (60 s timeout), stdout
# and stderr together in $out, its duration in $elapsed_ms. WANT is an exit
# status or "fail" (non-zero, not a timeout, not a signal).
client() {
  local name="$1" want="$2"
  shift 2
  checks=$((checks + 1))
  out="$tmp/$name.client"
  local t0
  t0=$(now_ms)
  timeout 60 "$rdmaemu" run --lib "$libdir" --engine "$engine" -- "$@" >"$out" 2>&1
  local rc=$?
  elapsed_ms=$(( $(now_ms) - t0 ))
  local ok=1
  if [[ "$want" == fail ]]; then
    (( rc != 0 && rc != 124 && (rc < 128 || rc == 255) )) || ok=0
  else
    [[ "$rc" == "$want" ]] || ok=0
  fi
  if (( ! ok )); then
    fail "$name: client exit status $rc, want $want, after ${elapsed_ms} ms; its output:"
    sed 's/^/    /' "$out" | head -30
    [[ -n "$server_pid" ]] && { echo "    --- server so far:"; sed 's/^/    /' "$server_log" | head -30; }
    return 1
  fi
  return 0
}

has() {  # has NAME FILE ERE: some line of FILE matches
  checks=$((checks + 1))
  if ! grep -qE -- "$3" "$2"; then
    fail "$1: no line matching '$3' in $(basename "$2"):"
    sed 's/^/    /' "$2" | head -40
  fi
}

hasnt() {  # hasnt NAME FILE ERE: no line of FILE matches
  checks=$((checks + 1))
  if grep -qE -- "$3" "$2"; then
    fail "$1: unexpected line matching '$3' in $(basename "$2"):"
    grep -E -- "$3" "$2" | sed 's/^/    /' | head -5
  fi
}

count_is() {  # count_is NAME FILE ERE N: exactly N lines of FILE match
  checks=$((checks + 1))
  local n
  n=$(grep -cE -- "$3" "$2")
  if [[ "$n" != "$4" ]]; then
    fail "$1: $n lines matching '$3' in $(basename "$2"), want $4:"
    sed 's/^/    /' "$2" | head -40
  fi
}

# A program that crashed or found no symbol says so in its output.
sane() {  # sane NAME FILE
  hasnt "$1" "$2" 'Segmentation|Aborted|symbol lookup error|rdma_cm: No such|rdmaemu\[[0-9]+\] error'
}

cleanup_server() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
}
trap cleanup_server EXIT

finish() {
  echo "$checks checks, $failures failures"
  [[ $failures -eq 0 ]]
}

unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB RDMAEMU_FAULTS RDMAEMU_PCAP
export RDMAEMU_LOG=warn
