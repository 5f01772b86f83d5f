# Shared by the end-to-end tests: sourced, not run. Each test script is
# called as `TEST.sh RDMAEMU LIBIBVERBS`, and runs Debian's unmodified
# binaries through `rdmaemu run`.
set -u
rdmaemu="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
lib="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Every test needs these from ibverbs-utils (tools/setup installs it).
need() {
  for p in "$@"; do
    if ! command -v "$p" >/dev/null; then
      echo "FAIL: $p is not installed (run tools/setup)"
      exit 1
    fi
  done
}

# t NAME WANT CMD...: runs CMD with a timeout; stdout in $out, stderr in $err.
# WANT is an exit status, or "fail" for any clean failure: non-zero, neither
# a timeout nor a signal (255 is exit(-1), which ibv_devinfo uses). Returns 1 if the status is wrong.
t() {
  local name="$1" want="$2"
  shift 2
  checks=$((checks + 1))
  out="$tmp/$name.out"
  err="$tmp/$name.err"
  timeout 60 "$@" >"$out" 2>"$err"
  local rc=$?
  local ok=1
  if [[ "$want" == fail ]]; then
    (( rc != 0 && rc != 124 && (rc < 128 || rc == 255) )) || ok=0
  else
    [[ "$rc" == "$want" ]] || ok=0
  fi
  if (( ! ok )); then
    fail "$name: exit status $rc, want $want; stdout, stderr:"
    sed 's/^/    /' "$out" | head -20
    sed 's/^/    /' "$err" | head -20
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

finish() {
  echo "$checks checks, $failures failures"
  [[ $failures -eq 0 ]]
}

# Whatever the caller's environment says, start from the default device.
unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB
export RDMAEMU_LOG=warn
