#!/usr/bin/env bash
# Wireshark's InfiniBand CM dissector reads the MADs emulator/cm writes: one
# of each message in whole RoCE v2 packets (mad_tshark_pcap), every field it
# decodes equal to the value set, the bytes of the messages it does not
# decode where the IBA puts them, no packet malformed, no expert warning.
#   mad_tshark_test.sh MAD_TSHARK_PCAP
set -u
pcap_tool="$1"
command -v tshark >/dev/null || { echo "SKIP: no tshark"; exit 0; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ts() { tshark -r "$tmp/cm.pcap" "$@" 2>/dev/null; }

"$pcap_tool" "$tmp/cm.pcap" >"$tmp/expected" || { echo "FAIL: $pcap_tool failed"; exit 1; }
frames=$(ts | wc -l)
(( frames == 9 )) || fail "$frames packets in the capture, want 9"

malformed=$(ts -Y '_ws.malformed || _ws.expert.severity >= warning' | wc -l)
(( malformed == 0 )) || { fail "$malformed malformed packets or expert warnings:"; ts -Y '_ws.malformed || _ws.expert'; }

# One tshark run for every field: decoded[FRAME FIELD] = what it shows
# ("|" separates, as a tab would run empty fields together for read).
mapfile -t fields < <(awk '$2 == "field" {print $3}' "$tmp/expected" | sort -u)
args=(-T fields -E "separator=|" -e frame.number -e infiniband.mad.data)
for f in "${fields[@]}"; do args+=(-e "$f"); done
declare -A decoded
while IFS="|" read -r -a values; do
  frame="${values[0]}"
  decoded["$frame data"]="${values[1]:-}"
  for i in "${!fields[@]}"; do decoded["$frame ${fields[$i]}"]="${values[$((i + 2))]:-}"; done
done < <(ts "${args[@]}")

checks=0
while read -r frame kind a b; do
  checks=$((checks + 1))
  if [[ "$kind" == bytes ]]; then
    data="${decoded["$frame data"]:-}"
    got="${data:$((2 * a)):${#b}}"
    [[ "$got" == "$b" ]] || fail "frame $frame message bytes at $a: Wireshark has '$got', want '$b'"
    continue
  fi
  got="${decoded["$frame $a"]:-}"
  if [[ "$b" =~ ^0x[0-9a-f]+$ && "$got" =~ ^(0x[0-9a-fA-F]+|[0-9]+)$ ]]; then
    (( got == b )) || fail "frame $frame $a: Wireshark shows $got, want $b"
  elif [[ "$got" != "$b" ]]; then
    fail "frame $frame $a: Wireshark shows '$got', want '$b'"
  fi
done <"$tmp/expected"

echo "$frames packets, $checks checks, $failures failures"
(( checks > 100 )) || fail "only $checks checks"
exit $(( failures > 0 ))
