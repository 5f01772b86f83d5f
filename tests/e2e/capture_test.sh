#!/usr/bin/env bash
# RDMAEMU_PCAP, read back with Debian's tshark: every packet decodes with
# its BTH (opcode, destination QP, PSN) and the extension headers its
# opcode carries, no packet is malformed, every IPv4 checksum is right, and
# the two sides of a connection captured the same packets.
#   capture_test.sh RDMAEMU LIBIBVERBS
source "$(dirname "$0")/e2e_lib.sh"
need ibv_rc_pingpong ib_read_bw ib_atomic_bw tshark

ts() { tshark -o ip.check_checksum:TRUE -r "$@" 2>/dev/null; }

# check_pcap NAME FILE: the checks every capture must pass.
check_pcap() {
  local name="$1" f="$2"
  checks=$((checks + 1))
  if [[ ! -s "$f" ]]; then fail "$name: no capture file $f"; return; fi
  local total bth bad malformed
  total=$(ts "$f" | wc -l)
  bth=$(ts "$f" -T fields -e infiniband.bth.opcode -e infiniband.bth.destqp -e infiniband.bth.psn \
        | awk -F'\t' '$1 != "" && $2 != "" && $3 != ""' | wc -l)
  malformed=$(ts "$f" -Y '_ws.malformed || _ws.expert.severity >= warning' | wc -l)
  bad=$(ts "$f" -Y 'ip.checksum.status != 1 || udp.dstport != 4791' | wc -l)
  echo "$name: $total packets, $bth with a whole BTH, $malformed malformed, $bad bad IPv4/UDP"
  (( total > 0 )) || fail "$name: empty capture"
  (( bth == total )) || fail "$name: $((total - bth)) packets without opcode, destination QP and PSN"
  (( malformed == 0 )) || { fail "$name: malformed packets:"; ts "$f" -Y _ws.malformed | head -5; }
  (( bad == 0 )) || fail "$name: $bad packets with a wrong IPv4 checksum or UDP port"
}

# count NAME FILE FILTER MIN: at least MIN packets match the display filter.
count() {
  checks=$((checks + 1))
  local n
  n=$(ts "$2" -Y "$3" | wc -l)
  (( n >= $4 )) || fail "$1: $n packets match '$3', want at least $4"
}

port=$(( 20000 + RANDOM % 20000 ))

# 1. ibv_rc_pingpong: 3000-byte messages on a 1024-byte MTU (SEND FIRST,
# MIDDLE, LAST and ACKs), each side capturing into its own file; the
# server's name has its pid (%p).
RDMAEMU_PCAP="$tmp/server-%p.pcap" "$rdmaemu" run -- \
  ibv_rc_pingpong -g 0 -p $port -n 20 -s 3000 -m 1024 -c >"$tmp/server.out" 2>&1 &
server=$!  # `rdmaemu run` execs the program: the same pid
sleep 0.3
RDMAEMU_PCAP="$tmp/client.pcap" t pingpong 0 "$rdmaemu" run -- \
  ibv_rc_pingpong -g 0 -p $port -n 20 -s 3000 -m 1024 -c 127.0.0.1
wait $server || fail "pingpong server exited with status $?"
check_pcap pingpong-client "$tmp/client.pcap"
check_pcap pingpong-server "$tmp/server-$server.pcap"
count pingpong-client "$tmp/client.pcap" 'infiniband.bth.opcode == 0' 40        # SEND FIRST
count pingpong-client "$tmp/client.pcap" 'infiniband.bth.opcode == 1' 40        # SEND MIDDLE
count pingpong-client "$tmp/client.pcap" 'infiniband.bth.opcode == 2' 40        # SEND LAST
count pingpong-client "$tmp/client.pcap" 'infiniband.bth.opcode == 17 && infiniband.aeth.msn' 20
# Each side saw every packet: what one sent the other received.
checks=$((checks + 1))
a=$(ts "$tmp/client.pcap" -T fields -e ip.src -e infiniband.bth.opcode -e infiniband.bth.psn | sort | md5sum)
b=$(ts "$tmp/server-$server.pcap" -T fields -e ip.src -e infiniband.bth.opcode -e infiniband.bth.psn | sort | md5sum)
[[ "$a" == "$b" ]] || fail "the client's and the server's captures differ"

# 2. perftest READ and atomics: RETH on read requests, AETH on read
# responses, AtomicETH on atomics and AtomicAckETH on their answers.
perf() {  # NAME PROGRAM ARGS...: server and client, the client captured
  local name="$1" program="$2" attempt server rc
  shift 2
  checks=$((checks + 1))
  for attempt in 1 2 3; do
    port=$((port + 1))
    "$rdmaemu" run -- "$program" -d emu0 -x 0 -p $port "$@" >"$tmp/$name-server.out" 2>&1 &
    server=$!
    sleep 0.5
    RDMAEMU_PCAP="$tmp/$name.pcap" timeout 60 "$rdmaemu" run -- \
      "$program" -d emu0 -x 0 -p $port "$@" 127.0.0.1 >"$tmp/$name.out" 2>"$tmp/$name.err"
    rc=$?
    # perftest calibrates its cycle counter against the clock as it starts;
    # on a loaded virtual machine the fit can fail ("Correlation coefficient
    # r^2 ... < 0.9"), whatever the device does: that pair starts over.
    grep -q 'Correlation coefficient r^2' "$tmp/$name.out" "$tmp/$name-server.out" || break
    echo "$name: perftest's clock calibration failed (attempt $attempt); again"
    kill $server 2>/dev/null
    wait $server 2>/dev/null
  done
  if (( rc != 0 )); then
    fail "$name: exit status $rc, want 0; stdout, stderr:"
    sed 's/^/    /' "$tmp/$name.out" | head -20
    sed 's/^/    /' "$tmp/$name.err" | head -20
  fi
  wait $server || fail "$name server exited with status $?"
  check_pcap "$name" "$tmp/$name.pcap"
}
perf read ib_read_bw -n 50 -s 12288  # three 4096-byte responses each
count read "$tmp/read.pcap" 'infiniband.bth.opcode == 12 && infiniband.reth.va && infiniband.reth.dmalen == 12288' 50
count read "$tmp/read.pcap" 'infiniband.bth.opcode == 13 && infiniband.aeth' 50   # READ RESPONSE FIRST
count read "$tmp/read.pcap" 'infiniband.bth.opcode == 14' 50                       # READ RESPONSE MIDDLE
count read "$tmp/read.pcap" 'infiniband.bth.opcode == 15 && infiniband.aeth' 50   # READ RESPONSE LAST
perf atomic ib_atomic_bw -n 50
count atomic "$tmp/atomic.pcap" 'infiniband.atomiceth && (infiniband.bth.opcode == 19 || infiniband.bth.opcode == 20)' 50
count atomic "$tmp/atomic.pcap" 'infiniband.bth.opcode == 18 && infiniband.aeth && infiniband.atomicacketh' 50

# 3. A file that cannot be created fails the device open and says why.
RDMAEMU_PCAP=/nonexistent-dir/x.pcap t badpath fail "$rdmaemu" run -- ibv_devinfo
has badpath "$tmp/badpath.err" "RDMAEMU_PCAP: cannot create the capture file '/nonexistent-dir/x.pcap': No such file or directory"

finish
