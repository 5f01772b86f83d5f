#!/bin/bash
# Compares the dynamic symbol table of our librdmacm.so.1 with rdma-core 44's
# (Debian's /usr/lib/x86_64-linux-gnu/librdmacm.so.1):
#   - the default-version (@@) symbols: names, version nodes and types
#   - the version nodes and their parents
#   - SONAME librdmacm.so.1
#   - nothing else exported: no C++ (_Z) symbol, no unversioned symbol
#   - NEEDED libibverbs.so.1 (ours, which it links) and no libnl (rdma-core's
#     netlink route lookups have no counterpart here)
#   - with LD_LIBRARY_PATH the directory of our libibverbs.so.1, as
#     `rdmaemu run` sets it, the loader resolves libibverbs.so.1 to ours
# Usage: rdmacm_exports_test.sh OUR_LIB [OUR_LIBIBVERBS [REAL_LIB]]
# OUR_LIBIBVERBS defaults to the libibverbs.so.1 beside OUR_LIB.
set -u

ours="$1"
verbs="${2:-$(dirname "$1")/libibverbs.so.1}"
real="${3:-/usr/lib/x86_64-linux-gnu/librdmacm.so.1}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

command -v readelf >/dev/null || { echo "SKIP: readelf not installed"; exit 0; }
[[ -r "$ours" ]] || { echo "FAIL: $ours not found"; exit 1; }
[[ -r "$real" ]] || { echo "SKIP: $real not installed (apt-get install librdmacm1)"; exit 0; }

tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# "name@@VERSION TYPE" for every defined default-version symbol.
default_symbols() {
  readelf --dyn-syms -W "$1" |
    awk '$7 != "UND" && $8 ~ /@@/ { print $8, $4 }' | sort -u
}
default_symbols "$real" > "$tmp/real.syms"
default_symbols "$ours" > "$tmp/ours.syms"
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
if ! diff <(version_defs "$real") <(version_defs "$ours") > "$tmp/versions.diff"; then
  fail "version nodes differ (< rdma-core, > ours):"
  sed 's/^/    /' "$tmp/versions.diff"
fi

soname=$(readelf -d -W "$ours" | awk '/\(SONAME\)/ { gsub(/[][]/, "", $NF); print $NF }')
[[ "$soname" == "librdmacm.so.1" ]] || fail "SONAME is '$soname', want librdmacm.so.1"

# Everything defined and visible (GLOBAL/WEAK) must carry one of our versions.
unversioned=$(readelf --dyn-syms -W "$ours" |
  awk '$7 != "UND" && $7 != "ABS" && ($5 == "GLOBAL" || $5 == "WEAK") && $8 !~ /@/ { print "    " $8 " (" $4 ", " $5 ")" }')
[[ -z "$unversioned" ]] || fail "unversioned symbols exported (version script not applied?):"$'\n'"$unversioned"
cxx=$(readelf --dyn-syms -W "$ours" |
  awk '$7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") && $8 ~ /^_Z/ { print "    " $8 }')
if [[ -n "$cxx" ]]; then
  fail "C++ symbols exported (link with ld.bfd or keep such instantiations hidden):"$'\n'"$cxx"
fi

needed=$(readelf -d -W "$ours" | awk '/\(NEEDED\)/ { gsub(/[][]/, "", $NF); print $NF }')
grep -qx 'libibverbs.so.1' <<< "$needed" || fail "no NEEDED libibverbs.so.1 (NEEDED: $(echo $needed))"
libnl=$(grep '^libnl' <<< "$needed")
[[ -z "$libnl" ]] || fail "NEEDED on libnl: $(echo $libnl)"

# The loader, given our libibverbs' directory first (what `rdmaemu run` does),
# must bind librdmacm's libibverbs.so.1 to that library, not Debian's.
if [[ ! -r "$verbs" ]]; then
  fail "our libibverbs.so.1 not found at $verbs"
else
  verbs_dir=$(cd "$(dirname "$verbs")" && pwd)
  resolved=$(LD_LIBRARY_PATH="$verbs_dir" LD_TRACE_LOADED_OBJECTS=1 /lib64/ld-linux-x86-64.so.2 "$ours" 2>&1 |
    awk '$1 == "libibverbs.so.1" && $2 == "=>" { print $3 }')
  if [[ -z "$resolved" ]]; then
    fail "the loader did not resolve libibverbs.so.1 for $ours"
  elif [[ "$(readlink -f "$resolved")" != "$(readlink -f "$verbs")" ]]; then
    fail "libibverbs.so.1 resolves to $resolved ($(readlink -f "$resolved")), not ours ($(readlink -f "$verbs"))"
  fi
fi

if (( failures > 0 )); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS: $(wc -l < "$tmp/ours.syms") symbols, same names, versions and types as rdma-core; libibverbs.so.1 is ours"
