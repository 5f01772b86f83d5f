#!/usr/bin/env bash
# One rping connection (-v -C 3) captured on both sides (RDMAEMU_PCAP) and
# read back with Debian's tshark, on both engines: the connection's setup
# and teardown decode as InfiniBand CM, in order REQ, REP, RTU, DREQ, DREP
# (attribute IDs 0x0010, 0x0013, 0x0014, 0x0015, 0x0016), each a GSI MAD
# (UD SEND from QP1 to QP1, Q_Key 0x80010000, management class 7, class
# version 2) on UDP 4791 in the right direction; the REQ carries the IP CM
# service ID with rping's port (7174) and the client's address as its
# primary local GID; no packet is malformed or draws an expert warning; both
# sides captured the same CM messages. The CM lines of tshark's summary
# are printed. rping's client exits right after rdma_disconnect without
# waiting for the DISCONNECTED event, and its device lives in its process
# (not in a kernel that outlives it): a DREP arriving after that exit is in
# the server's capture only, so the client's may end at its DREQ.
#   capture_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need rping tshark ss

ts() { tshark -o ip.check_checksum:TRUE -r "$@" 2>/dev/null; }
cm='infiniband.mad.mgmtclass == 0x07'

for engine in uring epoll; do
  a=$(new_host)
  name="$engine-capture"
  cpcap="$tmp/$name-client.pcap"
  spcap="$tmp/$name-server.pcap"
  RDMAEMU_PCAP="$spcap" start_server "$name" "$a" rping -s -a "$a" -v -C 3
  if ! RDMAEMU_PCAP="$cpcap" client "$name" 0 rping -c -a "$a" -v -C 3; then
    cleanup_server; server_pid=""; continue
  fi
  wait_server "$name" 0 || continue
  for f in "$cpcap" "$spcap"; do
    checks=$((checks + 1))
    [[ -s "$f" ]] || { fail "$name: no capture $f"; continue 2; }
  done

  # Who the client was: the REQ's source.
  c=$(ts "$cpcap" -Y "$cm && infiniband.mad.attributeid == 0x0010" -T fields -e ip.src | head -1)
  echo "== $engine: client $c, server $a; tshark -r client.pcap -Y '$cm':"
  ts "$cpcap" -Y "$cm" | sed 's/^/    /'

  for side in client server; do
    f="$tmp/$name-$side.pcap"
    ts "$f" -Y "$cm" -T fields -e ip.src -e ip.dst -e udp.dstport -e infiniband.bth.opcode \
      -e infiniband.bth.destqp -e infiniband.deth.srcqp -e infiniband.deth.q_key \
      -e infiniband.mad.classversion -e infiniband.mad.attributeid >"$tmp/$name-$side.cm"
    checks=$((checks + 1))
    want="$c $a 4791 100 0x000001 0x00000001 0x0000000080010000 0x02 0x0010
$a $c 4791 100 0x000001 0x00000001 0x0000000080010000 0x02 0x0013
$c $a 4791 100 0x000001 0x00000001 0x0000000080010000 0x02 0x0014
$c $a 4791 100 0x000001 0x00000001 0x0000000080010000 0x02 0x0015
$a $c 4791 100 0x000001 0x00000001 0x0000000080010000 0x02 0x0016"
    got=$(tr '\t' ' ' <"$tmp/$name-$side.cm")
    if [[ $side == client && "$got" == "$(head -4 <<<"$want")" ]]; then
      echo "   ($name: the client had exited when the DREP came)"
      got=$want
    fi
    if [[ "$got" != "$want" ]]; then
      fail "$name: the $side's capture has these CM MADs (src dst udp opcode destqp srcqp qkey classversion attributeid):"
      sed 's/^/    /' <<<"$got"
      echo "    want REQ, REP, RTU, DREQ, DREP:"
      sed 's/^/    /' <<<"$want"
    fi
    # Every summary line names its CM message.
    checks=$((checks + 1))
    names=$(ts "$f" -Y "$cm" | sed -nE 's/.* CM: ([A-Za-z]+).*/\1/p' | tr '\n' ' ')
    [[ "$names" == "ConnectRequest ConnectReply ReadyToUse DisconnectRequest DisconnectReply " ||
       ( $side == client && "$names" == "ConnectRequest ConnectReply ReadyToUse DisconnectRequest " ) ]] ||
      fail "$name: the $side's CM summary lines name '$names'"
    checks=$((checks + 1))
    bad=$(ts "$f" -Y '_ws.malformed || _ws.expert.severity >= warning || ip.checksum.status != 1' | wc -l)
    (( bad == 0 )) || { fail "$name: $bad malformed or warned packets in the $side's capture:"; ts "$f" -Y '_ws.malformed || _ws.expert.severity >= warning' | head -5; }
    # The data between them is RC on the connection's QPs, every packet
    # with its BTH.
    checks=$((checks + 1))
    total=$(ts "$f" | wc -l)
    bth=$(ts "$f" -T fields -e infiniband.bth.opcode -e infiniband.bth.destqp | awk -F'\t' '$1 != "" && $2 != ""' | wc -l)
    (( total > 5 && bth == total )) || fail "$name: $side capture: $total packets, $bth with a BTH"
  done
  # The REQ's service ID is the IP CM one for TCP port 7174, and its path
  # names the two hosts' IPv4-mapped GIDs.
  req=$(ts "$cpcap" -Y "$cm && infiniband.mad.attributeid == 0x0010" -T fields \
        -e infiniband.cm.req.serviceid.prefix -e infiniband.cm.req.serviceid.protocol \
        -e infiniband.cm.req.serviceid.dport -e infiniband.cm.req.prim_localgid_ipv4 \
        -e infiniband.cm.req.prim_remotegid_ipv4 | tr '\t' ' ')
  checks=$((checks + 1))
  [[ "$req" == "0000000001 0x06 0x1c06 $c $a" ]] ||
    fail "$name: REQ service ID prefix, protocol, port, local GID, remote GID '$req', want '0000000001 0x06 0x1c06 $c $a'"
  checks=$((checks + 1))
  cmp -s "$tmp/$name-client.cm" "$tmp/$name-server.cm" ||
    cmp -s "$tmp/$name-client.cm" <(head -4 "$tmp/$name-server.cm") ||
    fail "$name: the client's and the server's captures hold different CM MADs"
done

finish
