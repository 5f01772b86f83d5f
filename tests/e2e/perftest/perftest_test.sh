#!/usr/bin/env bash
# Debian's unmodified perftest binaries (linked against libmlx5, libefa and
# librdmacm too) between two processes on the emulator, on both engines:
# first exchanging QP numbers over perftest's own TCP socket, then
# connecting through RDMA CM (-R) with our librdmacm.so.1, the server an
# emulated host of its own address (the client resolves it).
#   perftest_test.sh LIBIBVERBS LIBRDMACM
set -u
libdir=$(mktemp -d)
trap 'rm -rf "$libdir"' EXIT
cp "$1" "$libdir/libibverbs.so.1"
cp "$2" "$libdir/librdmacm.so.1"

failures=0
port=$(( 20000 + RANDOM % 20000 ))
run() {  # engine, program, args...
  local engine="$1" program="$2"
  shift 2
  if ! command -v "$program" >/dev/null; then
    echo "FAIL: $program is not installed (tools/setup installs perftest)"; failures=$((failures + 1)); return
  fi
  port=$(( port + 1 ))
  local log="$libdir/server.$port.log"
  # With -R the client connects to the server's device address; without,
  # to perftest's TCP socket on 127.0.0.1.
  local server_ip=127.0.0.1 server_env=()
  if [[ " $* " == *" -R "* ]]; then
    server_ip="127.$((100 + RANDOM % 100)).$((RANDOM % 256)).$((2 + RANDOM % 250))"
    server_env=(RDMAEMU_ADDRESS="$server_ip")
  fi
  env "${server_env[@]}" RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 \
    "$program" -d emu0 -x 0 -p "$port" "$@" >"$log" 2>&1 &
  local server=$!
  if [[ -n "${server_env[*]}" ]]; then
    # Connecting before the server listens is refused at once (REJECTED):
    # wait until its device holds the address, then for rdma_listen.
    for _ in $(seq 100); do
      ss -Hlun "src = $server_ip:4791" 2>/dev/null | grep -q . && break
      sleep 0.05
    done
  fi
  sleep 0.5
  local out
  local client_rc tries=0
  while :; do
    out=$(RDMAEMU_ENGINE=$engine LD_LIBRARY_PATH="$libdir" timeout 60 \
      "$program" -d emu0 -x 0 -p "$port" "$@" "$server_ip" 2>&1)
    client_rc=$?
    # A loaded machine may take longer than the wait above from the server's
    # address to its rdma_listen: the REQ is then refused at once (event 8,
    # REJECTED: nobody listens), which leaves the server waiting, untouched.
    # Start the client again, as perftest's own retry means to (it retries
    # on the ids it destroyed, which fails with EINVAL).
    if [[ -z "${server_env[*]}" ]] || (( ++tries >= 5 )) ||
       ! grep -qE 'RDMA_CM_EVENT_REJECTED; error: 8|Unexpected CM event bl blka 8$' <<<"$out"; then
      break
    fi
    echo "note: $program $*: refused before the server listened; client started again"
    sleep 1
  done
  wait "$server"
  local server_rc=$?
  # The result table's data line starts with the message size in bytes.
  if [ $client_rc -ne 0 ] || [ $server_rc -ne 0 ] || ! grep -qE '^ *[0-9]+ +[0-9]+ ' <<<"$out"; then
    echo "FAIL: $program engine=$engine $* (client $client_rc, server $server_rc)"
    echo "--- client:"; echo "$out"; echo "--- server:"; cat "$log"
    failures=$((failures + 1))
  else
    echo "ok: $program engine=$engine $*: $(grep -E '^ *[0-9]+ +[0-9]+ ' <<<"$out" | tail -1 | tr -s ' ')"
  fi
}

for engine in uring epoll; do
  run "$engine" ib_send_bw -n 500 -s 65536
  run "$engine" ib_write_bw -n 500 -s 65536
  run "$engine" ib_read_bw -n 500 -s 65536
  run "$engine" ib_atomic_bw -n 500
  run "$engine" ib_send_lat -n 500
  run "$engine" ib_write_lat -n 500
  run "$engine" ib_read_lat -n 500
  # Through RDMA CM.
  run "$engine" ib_send_bw -R -n 500 -s 65536
  run "$engine" ib_write_bw -R -n 500 -s 65536
  run "$engine" ib_read_lat -R -n 500
  run "$engine" ib_atomic_bw -R -n 500
done
[ $failures -eq 0 ] && echo PASS || echo "$failures failure(s)"
exit $(( failures > 0 ))
