# Shared by the soak tests: sourced, not run. Each test script is called as
#   TEST.sh RDMAEMU LIBIBVERBS SOAK
# and runs the soak program's server and client as two processes through
# `rdmaemu run`.
set -u
rdmaemu="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
libdir="$(cd "$(dirname "$2")" && pwd)"
soak="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Whatever the caller's environment says, start from the default device.
unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB RDMAEMU_FAULTS RDMAEMU_PCAP
export RDMAEMU_LOG=warn
tcp_port=$(( 20000 + RANDOM % 20000 ))

# soak_pair NAME ENGINE TIMEOUT [CLIENT_ARGS...]: runs a server and a client
# (the client's arguments choose the run; RDMAEMU_FAULTS and the rest of the
# environment apply to both). Sets $client_out, $server_out, $client_err,
# $server_err, $client_rc, $server_rc and $elapsed; returns 0 if both exited 0 with a summary line.
soak_pair() {
  local name="$1" engine="$2" limit="$3"
  shift 3
  tcp_port=$(( tcp_port + 1 ))
  client_out="$tmp/$name.client.out"; client_err="$tmp/$name.client.err"
  server_out="$tmp/$name.server.out"; server_err="$tmp/$name.server.err"
  local start=$SECONDS
  timeout $(( limit + 10 )) "$rdmaemu" run --lib "$libdir" --engine "$engine" -- \
    "$soak" server --port "$tcp_port" --timeout "$limit" >"$server_out" 2>"$server_err" &
  local server=$!
  timeout $(( limit + 10 )) "$rdmaemu" run --lib "$libdir" --engine "$engine" -- \
    "$soak" client --port "$tcp_port" --timeout "$limit" "$@" >"$client_out" 2>"$client_err"
  client_rc=$?
  wait "$server"
  server_rc=$?
  elapsed=$(( SECONDS - start ))
  if (( client_rc != 0 || server_rc != 0 )) || ! grep -q '^soak .* ok: ' "$client_out"; then
    fail "$name (engine $engine): client exit $client_rc, server exit $server_rc after ${elapsed}s"
    for f in "$client_out" "$client_err" "$server_out" "$server_err"; do
      echo "--- $(basename "$f"):"; tail -15 "$f" | sed 's/^/    /'
    done
    return 1
  fi
  echo "ok: $name (engine $engine, ${elapsed}s): $(grep '^soak .* ok: ' "$client_out")"
  return 0
}

# field NAME FILE: the number after "NAME=" on the summary line.
field() { grep -oE "(^| )$1=[0-9]+" "$2" | head -1 | cut -d= -f2; }

finish() {
  [[ $failures -eq 0 ]] && echo PASS || echo "$failures failure(s)"
  exit $(( failures > 0 ))
}
