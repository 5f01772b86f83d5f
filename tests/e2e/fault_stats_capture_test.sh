#!/bin/bash
# Issue 5's control-plane commands on running programs, on both engines:
# Debian's unmodified ibv_rc_pingpong (server and client, exchanging
# messages until killed) runs through `rdmaemu run --engine E`, and from
# another process
#   rdmaemu fault   adds a drop rule to the server, which `fault list` shows
#                   with a matched count that grows (and a bad rule is
#                   refused, naming its token, changing nothing);
#   rdmaemu stats   --json is valid JSON whose counters move: packets sent,
#                   retransmissions, and the packets the rule dropped;
#   rdmaemu capture start/stop writes a pcap that tshark decodes as RoCE,
#                   every packet with its BTH, none malformed.
# Usage: fault_stats_capture_test.sh RDMAEMU LIBIBVERBS
source "$(dirname "$0")/e2e_lib.sh"
need ibv_rc_pingpong stdbuf tshark python3

wait_for() {  # wait_for FILE ERE: up to 10 s for a line of FILE to match
  for _ in $(seq 100); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# json_get FILE EXPR: EXPR (python, on `d`, the parsed file) printed.
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# matched FILE: the matched count of the drop rule in `fault list` output.
matched() { sed -nE 's/^emu0: drop=0\.05@op=SEND  \(matched ([0-9]+) packets?\)$/\1/p' "$1" | head -1; }

port=$(( 20000 + RANDOM % 20000 ))

for engine in uring epoll; do
  export RDMAEMU_CONTROL_DIR="$tmp/ctl-$engine"
  port=$((port + 1))
  # 64-byte messages, one packet each; -e: completion events, no busy polling.
  pp=(stdbuf -oL ibv_rc_pingpong -g 0 -e -s 64 -p "$port" -n 100000000)
  "$rdmaemu" run --engine "$engine" -- "${pp[@]}" >"$tmp/server-$engine.out" 2>&1 &
  server=$!  # `rdmaemu run` execs the program: the same pid
  if ! wait_for "$tmp/server-$engine.out" 'local address'; then
    fail "$engine: the pingpong server did not start:"; sed 's/^/    /' "$tmp/server-$engine.out"
    kill "$server"; wait "$server"; continue
  fi
  "$rdmaemu" run --engine "$engine" -- "${pp[@]}" 127.0.0.1 >"$tmp/client-$engine.out" 2>&1 &
  client=$!
  for _ in $(seq 100); do
    [[ -S "$RDMAEMU_CONTROL_DIR/$server.sock" && -S "$RDMAEMU_CONTROL_DIR/$client.sock" ]] && break
    sleep 0.1
  done
  checks=$((checks + 1))
  if ! wait_for "$tmp/client-$engine.out" 'remote address'; then
    fail "$engine: the pingpong client did not connect:"; sed 's/^/    /' "$tmp/client-$engine.out"
    kill "$server" "$client"; wait; continue
  fi

  # --- fault: add, see it match more and more, a bad rule changes nothing
  t "$engine-fault-add" 0 "$rdmaemu" fault --pid "$server" emu0 add 'drop=0.05@op=SEND' &&
    has "$engine-fault-add" "$out" '^emu0: drop=0\.05@op=SEND  \(matched [0-9]+ packets?\)$'
  t "$engine-fault-list" 0 "$rdmaemu" fault list && {
    has "$engine-fault-list" "$out" "^pid $server:\$"
    has "$engine-fault-list" "$out" '^emu0: no fault rules$'  # the client's
  }
  first=$(matched "$out")
  checks=$((checks + 1))
  grown=""
  for _ in $(seq 100); do
    "$rdmaemu" fault --pid "$server" list >"$tmp/list-$engine.out" 2>&1
    n=$(matched "$tmp/list-$engine.out")
    [[ -n "$n" && -n "$first" ]] && (( n > first )) && { grown=$n; break; }
    sleep 0.1
  done
  [[ -n "$grown" ]] || { fail "$engine: the rule's matched count stayed at '$first':"; sed 's/^/    /' "$tmp/list-$engine.out"; }
  t "$engine-fault-bad" 2 "$rdmaemu" fault --pid "$server" emu0 add 'drop=0.1,dorp=0.2' &&
    has "$engine-fault-bad" "$err" 'unknown fault "dorp"'
  t "$engine-fault-after-bad" 0 "$rdmaemu" fault --pid "$server" emu0 list && {
    checks=$((checks + 1))
    n=$(grep -c 'matched' "$out")
    (( n == 1 )) || { fail "$engine: $n rules after a refused add, want 1:"; sed 's/^/    /' "$out"; }
  }

  # --- stats --json: valid, and its counters move
  t "$engine-stats-all" 0 "$rdmaemu" stats --json && {
    checks=$((checks + 1))
    python3 -m json.tool "$out" >/dev/null || { fail "$engine: stats --json (two programs) is not JSON:"; sed 's/^/    /' "$out" | head; }
    n=$(json_get "$out" 'len(d)')
    checks=$((checks + 1))
    [[ "$n" == 2 ]] || fail "$engine: stats --json without --pid gave $n objects, want an array of 2"
  }
  t "$engine-stats-1" 0 "$rdmaemu" stats --pid "$server" emu0 --json
  cp "$out" "$tmp/stats1-$engine.json"
  sent1=$(json_get "$tmp/stats1-$engine.json" 'd["stats"][0]["counters"]["packets_sent"]')
  checks=$((checks + 1))
  moved=""
  for _ in $(seq 100); do
    "$rdmaemu" stats --pid "$server" emu0 --json >"$tmp/stats2-$engine.json" 2>&1
    if python3 -m json.tool "$tmp/stats2-$engine.json" >/dev/null 2>&1; then
      sent2=$(json_get "$tmp/stats2-$engine.json" 'd["stats"][0]["counters"]["packets_sent"]')
      retx=$(json_get "$tmp/stats2-$engine.json" 'd["stats"][0]["counters"]["retransmissions"]')
      dropped=$(json_get "$tmp/stats2-$engine.json" 'd["stats"][0]["counters"]["fault_dropped"]')
      (( sent2 > sent1 && retx > 0 && dropped > 0 )) && { moved=1; break; }
    fi
    sleep 0.1
  done
  [[ -n "$moved" ]] || { fail "$engine: stats did not move (packets_sent $sent1 -> ${sent2:-?}, retransmissions ${retx:-?}, fault_dropped ${dropped:-?}):"; sed 's/^/    /' "$tmp/stats2-$engine.json" | head -20; }
  t "$engine-stats-text" 0 "$rdmaemu" stats --pid "$server" && {
    has "$engine-stats-text" "$out" "^process $server ibv_rc_pingpong device emu0\$"
    has "$engine-stats-text" "$out" '^packets_sent [1-9][0-9]*$'
    has "$engine-stats-text" "$out" '^fault_dropped [1-9][0-9]*$'
  }

  # --- capture: start, some packets, stop; tshark reads RoCE
  pcap="$tmp/cap-$engine-%p.pcap"
  file="$tmp/cap-$engine-$server.pcap"
  t "$engine-cap-start" 0 "$rdmaemu" capture --pid "$server" start "$pcap" &&
    has "$engine-cap-start" "$out" "^capturing into '$file'\$"
  t "$engine-cap-again" 1 "$rdmaemu" capture --pid "$server" start "$tmp/other.pcap" &&
    has "$engine-cap-again" "$err" "a capture into '$file' is running; stop it first"
  checks=$((checks + 1))
  many=""
  for _ in $(seq 100); do
    "$rdmaemu" capture --pid "$server" status >"$tmp/status-$engine.out" 2>&1
    n=$(sed -nE 's/^capturing into .*: ([0-9]+) packets? so far$/\1/p' "$tmp/status-$engine.out")
    [[ -n "$n" ]] && (( n >= 50 )) && { many=1; break; }
    sleep 0.1
  done
  [[ -n "$many" ]] || { fail "$engine: the capture did not reach 50 packets:"; sed 's/^/    /' "$tmp/status-$engine.out"; }
  t "$engine-cap-stop" 0 "$rdmaemu" capture --pid "$server" stop &&
    has "$engine-cap-stop" "$out" "^capture stopped: [0-9]+ packets in '$file'\$"
  t "$engine-cap-status" 0 "$rdmaemu" capture --pid "$server" status &&
    has "$engine-cap-status" "$out" '^not capturing$'
  ts() { tshark -r "$file" "$@" 2>/dev/null; }
  total=$(ts | wc -l)
  bth=$(ts -T fields -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn |
        awk -F'\t' '$1 != "" && $2 != "" && $3 != ""' | wc -l)
  malformed=$(ts -Y '_ws.malformed || _ws.expert.severity >= warning' | wc -l)
  stopped=$(sed -nE 's/^capture stopped: ([0-9]+) packets.*/\1/p' "$tmp/$engine-cap-stop.out")
  echo "$engine: capture of $total packets ($stopped said stop), $bth with a BTH, $malformed malformed"
  checks=$((checks + 3))
  (( total >= 50 && total == stopped )) || fail "$engine: $total packets in $file, stop said ${stopped:-?}"
  (( bth == total )) || fail "$engine: $((total - bth)) packets without a decoded BTH"
  (( malformed == 0 )) || { fail "$engine: malformed packets:"; ts -Y _ws.malformed | head -5; }

  t "$engine-fault-clear" 0 "$rdmaemu" fault --pid "$server" clear &&
    has "$engine-fault-clear" "$out" '^emu0: fault rules cleared$'
  kill -TERM "$server" "$client"
  wait "$server" "$client"
  hasnt "$engine" "$tmp/server-$engine.out" 'Segmentation|symbol lookup|rdmaemu.*error'
  hasnt "$engine" "$tmp/client-$engine.out" 'Segmentation|symbol lookup|rdmaemu.*error'
done

finish
