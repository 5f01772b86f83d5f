#!/usr/bin/env bash
# A connect nobody accepts, on both engines, with Debian's unmodified
# programs:
#   - to a host that exists (an rping server listens there on another
#     port) but a port where nobody listens: the host's CM answers REJ
#     reason 8 (invalid service ID) at once, so rping and ucmatose get
#     RDMA_CM_EVENT_REJECTED, error 8, well under a second, not a timeout;
#     the server then still serves a real client on its own port;
#   - to an address where no host is: no answer, the client's CM sends the
#     REQ again every 2*64 ms + 256 ms (its advertised remote response
#     timeout plus the local one) 15 times, then gives
#     RDMA_CM_EVENT_UNREACHABLE, error -110 (ETIMEDOUT): 16 REQs in the
#     client's capture, ~384 ms apart, ~6.1 s in all (ucmatose exits with
#     its status -110, 146).
#   reject_test.sh RDMAEMU LIBRDMACM
source "$(dirname "$0")/rdmacm_lib.sh"
need rping ucmatose tshark ss

for engine in uring epoll; do
  a=$(new_host)
  name="$engine-reject"
  start_server "$name" "$a" rping -s -a "$a" -p 7000 -C 1
  if client "$name-rping" fail rping -c -a "$a" -p 5555 -C 1; then
    has "$name-rping" "$out" '^cma event RDMA_CM_EVENT_REJECTED, error 8$'
    checks=$((checks + 1))
    (( elapsed_ms < 1500 )) || fail "$name-rping: REJECTED after ${elapsed_ms} ms, want at once (< 1500 ms)"
    echo "ok: $engine rping to port 5555 of $a: REJECTED in ${elapsed_ms} ms"
  fi
  if client "$name-ucmatose" 8 ucmatose -s "$a" -p 5555; then
    has "$name-ucmatose" "$out" '^cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8$'
    has "$name-ucmatose" "$out" '^return status 8$'
    checks=$((checks + 1))
    (( elapsed_ms < 1500 )) || fail "$name-ucmatose: REJECTED after ${elapsed_ms} ms, want at once (< 1500 ms)"
    echo "ok: $engine ucmatose to port 5555 of $a: REJECTED in ${elapsed_ms} ms"
  fi
  # The listener on port 7000 was not disturbed by the rejected requests.
  if client "$name-after" 0 rping -c -a "$a" -p 7000 -C 1; then
    wait_server "$name-after" 0 && has "$name-after server" "$server_log" '^server DISCONNECT EVENT'
  else
    cleanup_server; server_pid=""
  fi

  # Nobody at all at address b.
  b=$(new_host)
  name="$engine-unreachable"
  pcap="$tmp/$name.pcap"
  if RDMAEMU_PCAP="$pcap" client "$name" 146 ucmatose -s "$b"; then
    has "$name" "$out" '^cmatose: event: RDMA_CM_EVENT_UNREACHABLE, error: -110$'
    checks=$((checks + 1))
    (( elapsed_ms >= 5500 && elapsed_ms <= 9000 )) ||
      fail "$name: UNREACHABLE after ${elapsed_ms} ms, want about 6100 ms (16 REQs 384 ms apart)"
    tshark -r "$pcap" -Y 'infiniband.mad.attributeid == 0x0010' -T fields \
      -e frame.time_relative -e ip.dst 2>/dev/null >"$tmp/$name.reqs"
    count_is "$name" "$tmp/$name.reqs" "	${b//./\\.}\$" 16
    checks=$((checks + 1))
    gaps=$(awk 'NR > 1 { printf "%d ", ($1 - prev) * 1000 } { prev = $1 }' "$tmp/$name.reqs")
    awk 'NR > 1 { g = ($1 - prev) * 1000; if (g < 300 || g > 700) bad = 1 } { prev = $1 } END { exit bad }' \
      "$tmp/$name.reqs" || fail "$name: REQ retry intervals (ms) $gaps, want each about 384"
    echo "ok: $engine ucmatose to $b (no host): UNREACHABLE after ${elapsed_ms} ms," \
      "$(wc -l <"$tmp/$name.reqs") REQs, intervals (ms): $gaps"
  fi
done

finish
