#!/bin/sh
# A stand-in for a user's RDMA test suite, run by tools/docker/check inside
# the image (as `docker run ... rdmaemu ./example-tests.sh`, so under
# `rdmaemu run`): Debian's unmodified RC and UD pingpongs and rping, each
# as a server and a client in two processes on the loopback. Each client
# checks what it received; any failure exits non-zero.
set -eu

pair() {  # pair NAME SERVER-COMMAND -- CLIENT-COMMAND
  name=$1; shift
  server=""
  while [ "$1" != "--" ]; do server="$server $1"; shift; done
  shift
  echo "== $name"
  timeout 60 $server & s=$!
  sleep 1
  timeout 60 "$@"
  wait "$s"
  echo "ok: $name"
}

pair rc_pingpong ibv_rc_pingpong -g 0 -n 100 -c -- ibv_rc_pingpong -g 0 -n 100 -c 127.0.0.1
pair ud_pingpong ibv_ud_pingpong -g 0 -n 100 -c -- ibv_ud_pingpong -g 0 -n 100 -c 127.0.0.1
# rping's server takes the 127/8 address it binds; its client connects there.
pair rping rping -s -a 127.0.0.9 -v -C 3 -- rping -c -a 127.0.0.9 -v -C 3
echo "example-tests: all passed"
