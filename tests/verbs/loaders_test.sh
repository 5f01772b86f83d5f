#!/bin/bash
# Unmodified Debian programs load our libibverbs.so.1 through LD_LIBRARY_PATH
# and get past symbol lookup: every consumer is linked BIND_NOW, so a missing
# symbol or version node kills it before main ("symbol lookup error",
# "version `IBVERBS_1.x' not found"). Covers perftest (which also loads
# libmlx5/libefa/librdmacm, whose constructors call verbs_register_driver_34),
# pyverbs with its mlx5 and efa provider modules, and ibverbs-utils; and
# checks that the libibverbs.so.1 the loader picked is ours, not /usr/lib's.
# Programs that are not installed are skipped (tools/setup installs perftest,
# python3-pyverbs and ibverbs-utils).
# Usage: loaders_test.sh OUR_LIB
set -u

ours=$(readlink -f "$1")
libdir=$(dirname "$1")
libdir=$(cd "$libdir" && pwd)
failures=0
ran=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

lookup_errors() {
  grep -E "symbol lookup error|undefined symbol|version .IBVERBS_[^ ]*. not found|cannot open shared object" "$1"
}

# The path of the libibverbs.so.1 that ld.so loaded, from LD_DEBUG=files
# output on stdin ("calling init: <path>").
loaded_libibverbs() {
  sed -n 's/.*calling init: \([^ ]*libibverbs\.so\.1\)$/\1/p' | head -1
}

# run NAME EXPECT_RE CMD...: CMD must not die at symbol lookup nor by a signal,
# must load our library, and its output must match EXPECT_RE (if not empty).
run() {
  local name="$1" expect="$2"
  shift 2
  if ! command -v "$1" >/dev/null; then
    echo "SKIP: $name ($1 not installed)"
    return
  fi
  ran=$((ran + 1))
  local out="$tmp/$name.out" dbg="$tmp/$name.ld"
  LD_LIBRARY_PATH="$libdir" LD_DEBUG=files LD_DEBUG_OUTPUT="$dbg" RDMAEMU_LOG=warn \
    timeout 20 "$@" > "$out" 2>&1
  local rc=$?
  local errors
  errors=$(lookup_errors "$out")
  if [[ -n "$errors" ]]; then
    fail "$name: $errors"
    return
  fi
  if (( rc == 124 || (rc > 128 && rc < 160) )); then
    fail "$name: exit status $rc (timeout or killed by a signal); output:"
    sed 's/^/    /' "$out" | head -20
    return
  fi
  local loaded
  loaded=$(cat "$dbg".* 2>/dev/null | loaded_libibverbs)
  if [[ -z "$loaded" ]]; then
    fail "$name: libibverbs.so.1 was not loaded at all (LD_DEBUG=files shows no init call for it)"
    return
  elif [[ "$(readlink -f "$loaded")" != "$ours" ]]; then
    fail "$name: loaded $loaded, not ours ($ours)"
    return
  fi
  if [[ -n "$expect" ]] && ! grep -qE "$expect" "$out"; then
    fail "$name: output does not match /$expect/ (exit $rc):"
    sed 's/^/    /' "$out" | head -20
    return
  fi
  echo "ok: $name (exit $rc)"
}

# perftest: NEEDED libmlx5, libefa, librdmacm, libibverbs.
run ib_write_bw_usage "Usage:" ib_write_bw -h
run ib_send_lat_usage "Usage:" ib_send_lat -h

# pyverbs: the provider modules link libmlx5/libefa (BIND_NOW). The maps of
# the interpreter itself say which libibverbs.so.1 it mapped.
pyverbs_check='
import os, sys
import pyverbs.device, pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libibverbs.so.1" in l]
paths = sorted({os.path.realpath(p) for p in maps})
print("libibverbs:", " ".join(paths))
sys.exit(0 if paths == [sys.argv[1]] else 3)
'
if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import pyverbs' 2>/dev/null; then
  run pyverbs_import "^libibverbs: " /usr/bin/python3 -c "$pyverbs_check" "$ours"
  if grep -q "^libibverbs: " "$tmp/pyverbs_import.out" &&
     ! grep -qx "libibverbs: $ours" "$tmp/pyverbs_import.out"; then
    fail "pyverbs mapped another libibverbs: $(grep '^libibverbs: ' "$tmp/pyverbs_import.out")"
  fi
else
  echo "SKIP: pyverbs_import (python3-pyverbs not installed for /usr/bin/python3)"
fi

# ibverbs-utils: only loading is checked here; what they print is device
# logic, tested elsewhere.
run ibv_devices "" ibv_devices
run ibv_devinfo "" ibv_devinfo

if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
if (( ran == 0 )); then
  echo "SKIP: none of perftest, pyverbs, ibverbs-utils is installed"
  exit 0
fi
echo "PASS: $ran program(s) loaded our libibverbs.so.1"
