#!/bin/bash
# Compares the dynamic symbol table of our libibverbs.so.1 with rdma-core 44's
# (Debian's /usr/lib/x86_64-linux-gnu/libibverbs.so.1):
#   - the default-version (@@) symbols: names, version nodes and types
#   - the version nodes and their parents
#   - SONAME libibverbs.so.1; verbs_allow_disassociate_destroy a 1-byte OBJECT
#   - nothing else exported: no C++ (_Z) symbol, no unversioned symbol
#   - no NEEDED entry on a libibverbs (we replace it, never wrap it)
# Usage: exports_test.sh OUR_LIB [REAL_LIB]
set -u

ours="$1"
real="${2:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

command -v readelf >/dev/null || { echo "SKIP: readelf not installed"; exit 0; }
[[ -r "$ours" ]] || { echo "FAIL: $ours not found"; exit 1; }
[[ -r "$real" ]] || { echo "SKIP: $real not installed (apt-get install libibverbs1)"; exit 0; }

tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# "name@@VERSION TYPE" for every defined default-version symbol.
default_symbols() {
  readelf --dyn-syms -W "$1" |
    awk '$7 != "UND" && $8 ~ /@@/ { print $8, $4 }' | sort -u
}
default_symbols "$real" > "$tmp/real.syms"
# rdmaemu's own extension node (rdmaemu/rdmaemu.h) is ours alone.
default_symbols "$ours" | grep -v '@@RDMAEMU_' > "$tmp/ours.syms"
for sym in rdmaemu_set_port_state rdmaemu_query_counters rdmaemu_query_qp_counters \
    rdmaemu_fault_add rdmaemu_fault_clear rdmaemu_fault_list; do
  grep -q "^$sym@@RDMAEMU_1.0 " <(default_symbols "$ours") ||
    fail "$sym@@RDMAEMU_1.0 is not exported"
done
grep -q "^rdmaemu_query_port_address@@RDMAEMU_1.1 " <(default_symbols "$ours") ||
  fail "rdmaemu_query_port_address@@RDMAEMU_1.1 is not exported"
echo "rdma-core exports $(wc -l < "$tmp/real.syms") default-version symbols; ours $(wc -l < "$tmp/ours.syms")"

names() { sed 's/@@.*//' "$1" | sort -u; }
names "$tmp/real.syms" > "$tmp/real.names"
names "$tmp/ours.syms" > "$tmp/ours.names"

missing=$(comm -23 "$tmp/real.names" "$tmp/ours.names")
extra=$(comm -13 "$tmp/real.names" "$tmp/ours.names")
if [[ -n "$missing" ]]; then
  fail "$(echo "$missing" | wc -l) symbols missing (exported by rdma-core, not by us):"
  for n in $missing; do grep "^$n@@" "$tmp/real.syms" | sed 's/^/    /'; done
fi
if [[ -n "$extra" ]]; then
  fail "$(echo "$extra" | wc -l) extra symbols (exported by us, not by rdma-core):"
  for n in $extra; do grep "^$n@@" "$tmp/ours.syms" | sed 's/^/    /'; done
fi
# Same name, different version node or symbol type.
wrong=$(join <(sort "$tmp/real.syms" | sed 's/@@/ /' | sort -k1,1) \
              <(sort "$tmp/ours.syms" | sed 's/@@/ /' | sort -k1,1) |
        awk '$2 != $4 || $3 != $5 { printf "    %s: rdma-core %s %s, ours %s %s\n", $1, $2, $3, $4, $5 }')
[[ -z "$wrong" ]] || fail "symbols with the wrong version or type:"$'\n'"$wrong"

# Version definitions and their parents, in order.
version_defs() {
  readelf -V -W "$1" | sed -n '/Version definition/,/Version needs/p' |
    awk '/Name:/ { for (i = 1; i <= NF; i++) if ($i == "Name:") name = $(i + 1);
                   if ($0 ~ /BASE/) next; printf "%s", (n++ ? "\n" : "") name }
         /Parent 1:/ { printf " <- %s", $NF }
         END { print "" }'
}
if ! diff <(version_defs "$real") <(version_defs "$ours" | grep -v '^RDMAEMU_') > "$tmp/versions.diff"; then
  fail "version nodes differ (< rdma-core, > ours):"
  sed 's/^/    /' "$tmp/versions.diff"
fi

soname=$(readelf -d -W "$ours" | awk '/\(SONAME\)/ { gsub(/[][]/, "", $NF); print $NF }')
[[ "$soname" == "libibverbs.so.1" ]] || fail "SONAME is '$soname', want libibverbs.so.1"

data=$(readelf --dyn-syms -W "$ours" | awk '$8 == "verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"')
if [[ -z "$data" ]]; then
  fail "verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34 is not exported"
else
  read -r _ _ size type _ <<< "$data"
  [[ "$type" == "OBJECT" && "$size" == "1" ]] ||
    fail "verbs_allow_disassociate_destroy is '$type' of size $size, want a 1-byte OBJECT"
fi

# Everything defined and visible (GLOBAL/WEAK) must carry one of our versions.
unversioned=$(readelf --dyn-syms -W "$ours" |
  awk '$7 != "UND" && $7 != "ABS" && ($5 == "GLOBAL" || $5 == "WEAK") && $8 !~ /@/ { print "    " $8 " (" $4 ", " $5 ")" }')
[[ -z "$unversioned" ]] || fail "unversioned symbols exported (version script not applied?):"$'\n'"$unversioned"
cxx=$(readelf --dyn-syms -W "$ours" |
  awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") && $8 ~ /^_Z/ { print "    " $8 }')
if [[ -n "$cxx" ]]; then
  fail "C++ symbols exported (gold exports definitions that a linked DSO such as libspdlog imports, whatever the version script says; link with ld.bfd or keep such instantiations hidden):"$'\n'"$cxx"
fi

needed=$(readelf -d -W "$ours" | awk '/\(NEEDED\)/ && /libibverbs/ { print "    " $NF }')
[[ -z "$needed" ]] || fail "NEEDED on a libibverbs (we must replace it, not load it):"$'\n'"$needed"

if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: $(wc -l < "$tmp/ours.syms") symbols, same names, versions and types as rdma-core"
