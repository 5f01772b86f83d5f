#!/bin/bash
# rdmacm_test (our semantics tests, in one process and in two) and Debian's
# unmodified rping, through `rdmaemu run`, on both engines.
# Usage: rdmacm_test.sh RDMAEMU LIBIBVERBS RDMACM_TEST
set -u
rdmaemu="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# shellcheck source=tests/e2e/rping_race.sh
source "$(dirname "$0")/../../e2e/rping_race.sh"
# server_ok NAME PID LOG: the server PID exited 0, or lost rping's own
# teardown race (rping_race.sh) after its session.
server_ok() {
  wait "$2"
  local rc=$?
  (( rc == 0 )) && return 0
  if [[ $1 == rping* ]] && rping_lost_teardown_race "$rc" "$3"; then
    echo "note: $1: the server lost rping's teardown race; counted as passed"
    return 0
  fi
  return 1
}
# t NAME WANT CMD...: runs CMD with a timeout; its output in $out.
t() {
  local name="$1" want="$2"
  shift 2
  checks=$((checks + 1))
  out="$tmp/$name.out"
  timeout 120 "$@" >"$out" 2>&1
  local rc=$?
  if [[ "$rc" != "$want" ]]; then
    fail "$name: exit status $rc, want $want; output:"
    sed 's/^/    /' "$out" | tail -40
  fi
}
has() {  # has NAME FILE ERE
  checks=$((checks + 1))
  grep -qE -- "$3" "$2" || { fail "$1: no line matching '$3':"; sed 's/^/    /' "$2" | head -20; }
}
finish() { echo "$checks checks, $failures failures"; [[ $failures -eq 0 ]]; }
unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB
export RDMAEMU_LOG=warn
prog="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"

wait_for() {  # wait_for FILE ERE: up to 10 s
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

base=$(( 100 + RANDOM % 100 ))
for engine in uring epoll; do
  export RDMAEMU_ENGINE=$engine
  t "$engine-one-process" 0 "$rdmaemu" run -- "$prog" --gtest_filter='RdmaCm.*:Multicast.*'

  # Two processes: the server's bind makes its device take the address.
  base=$((base + 1))
  address="127.0.0.$base"
  sout="$tmp/server-$engine.out"
  RDMACM_TEST_ROLE=server RDMACM_TEST_ADDRESS=$address timeout 60 \
    "$rdmaemu" run -- "$prog" --gtest_filter='TwoProcess.ServerAndClient' >"$sout" 2>&1 &
  spid=$!
  checks=$((checks + 1))
  if wait_for "$sout" '^listening$'; then
    RDMACM_TEST_ROLE=client RDMACM_TEST_ADDRESS=$address \
      t "$engine-two-process-client" 0 "$rdmaemu" run -- "$prog" --gtest_filter='TwoProcess.ServerAndClient'
  else
    fail "$engine: the server did not listen:"; sed 's/^/    /' "$sout" | head -20
  fi
  wait "$spid" || { fail "$engine: the server failed:"; sed 's/^/    /' "$sout" | head -40; }

  # A server that exits with the connection open disconnects its client.
  base=$((base + 1))
  address="127.0.0.$base"
  sout="$tmp/leaving-server-$engine.out"
  # At debug level both say what their CMs sent and received, should the
  # DREQ of the server's exit ever not reach the client.
  RDMAEMU_LOG=debug RDMACM_TEST_ROLE=leaving-server RDMACM_TEST_ADDRESS=$address timeout 60 \
    "$rdmaemu" run -- "$prog" --gtest_filter='TwoProcess.PeerThatExitsDisconnects' >"$sout" 2>&1 &
  spid=$!
  checks=$((checks + 1))
  if wait_for "$sout" '^listening$'; then
    before=$failures
    RDMAEMU_LOG=debug RDMACM_TEST_ROLE=staying-client RDMACM_TEST_ADDRESS=$address \
      t "$engine-peer-exits-client" 0 "$rdmaemu" run -- "$prog" \
      --gtest_filter='TwoProcess.PeerThatExitsDisconnects'
    if [[ $failures -ne $before ]]; then
      wait "$spid"; src=$?
      spid=""
      [[ $src -eq 0 ]] || fail "$engine: the leaving server failed (status $src)"
      echo "    --- the leaving server:"; grep -E 'cm|exit|FAIL|OK' "$sout" | sed 's/^/    /' | tail -40
    fi
  else
    fail "$engine: the leaving server did not listen:"; sed 's/^/    /' "$sout" | head -20
  fi
  [[ -z $spid ]] || wait "$spid" || { fail "$engine: the leaving server failed:"; sed 's/^/    /' "$sout" | head -40; }

  # Debian's rping, unmodified, server and client.
  if command -v rping >/dev/null; then
    base=$((base + 1))
    address="127.0.0.$base"
    rout="$tmp/rping-server-$engine.out"
    timeout 60 "$rdmaemu" run -- rping -s -a "$address" -v -C 3 >"$rout" 2>&1 &
    rpid=$!
    sleep 0.5
    t "$engine-rping-client" 0 "$rdmaemu" run -- rping -c -a "$address" -v -C 3
    has "$engine-rping-client" "$out" 'ping data: rdma-ping-2'
    checks=$((checks + 1))
    server_ok rping "$rpid" "$rout" || { fail "$engine: rping -s failed:"; sed 's/^/    /' "$rout" | head -20; }
    has "$engine-rping-server" "$rout" 'server ping data: rdma-ping-2'
  fi

  # ucmatose (4 connections), udaddy (SIDR/UD), rdma_server/rdma_client
  # (the sync API), rping -q (QP-less connect + rdma_establish).
  for pair in "ucmatose|-b A -c 4 -C 10|ucmatose|-s A -c 4 -C 10" \
              "udaddy|-b A|udaddy|-s A" \
              "rdma_server|-s A|rdma_client|-s A" \
              "rping|-s -q -a A -C 3|rping|-c -q -a A -C 3"; do
    IFS='|' read -r sprog sargs cprog cargs <<<"$pair"
    command -v "$sprog" >/dev/null || continue
    base=$((base + 1))
    address="127.0.0.$base"
    sout="$tmp/$sprog-server-$engine-$base.out"
    # shellcheck disable=SC2086
    timeout 60 "$rdmaemu" run -- "$sprog" ${sargs//A/$address} >"$sout" 2>&1 &
    spid=$!
    sleep 0.5
    # shellcheck disable=SC2086
    t "$engine-$cprog-$base" 0 "$rdmaemu" run -- "$cprog" ${cargs//A/$address}
    checks=$((checks + 1))
    server_ok "$sprog" "$spid" "$sout" || { fail "$engine: $sprog ${sargs//A/$address} failed:"; sed 's/^/    /' "$sout" | head -20; }
  done

  # rdma_xserver/rdma_xclient, RC (-c r) and XRC (-c x: an XRC_SEND QP
  # connected to an XRC_RECV QP, the message landing in the server's XRC
  # SRQ, whose number travels in the REP's private data): the server binds
  # the any-address, so its host is fixed by RDMAEMU_ADDRESS.
  if command -v rdma_xserver >/dev/null; then
    for mode in r x; do
      base=$((base + 1))
      address="127.0.0.$base"
      sout="$tmp/rdma_xserver-$mode-$engine.out"
      RDMAEMU_ADDRESS=$address timeout 60 "$rdmaemu" run -- rdma_xserver -c $mode -p 7471 >"$sout" 2>&1 &
      spid=$!
      sleep 0.5
      # A client that came before the server listened is refused
      # (ECONNREFUSED: nobody listens yet) and tries again.
      out="$tmp/rdma_xclient-$mode-$engine.out"
      for try in 1 2 3 4 5; do
        timeout 60 "$rdmaemu" run -- rdma_xclient -c $mode -s "$address" -p 7471 >"$out" 2>&1
        rc=$?
        [[ $rc -ne 0 ]] && grep -q 'refused' "$out" && kill -0 "$spid" 2>/dev/null || break
        sleep 0.5
      done
      checks=$((checks + 1))
      [[ $rc -eq 0 ]] || { fail "$engine-rdma_xclient-$mode: exit status $rc:"; sed 's/^/    /' "$out" | tail -20; }
      has "$engine-rdma_xclient-$mode" "$out" 'rdma_xclient: end 0'
      checks=$((checks + 1))
      wait "$spid" || { fail "$engine: rdma_xserver -c $mode failed:"; sed 's/^/    /' "$sout" | head -20; }
      has "$engine-rdma_xserver-$mode" "$sout" 'rdma_xserver: end 0'
    done
  fi
done
finish
