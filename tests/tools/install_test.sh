#!/usr/bin/env bash
# tools/install and tools/package as a user meets them, from the built files:
# an install into a temporary prefix works outside the source tree (the
# installed rdmaemu finds its own libraries, puts them first for the
# program, and Debian's ibv_rc_pingpong runs between two processes through
# it; the man pages render; the pkg-config file points at the prefix), and
# the Debian package holds the same files under /usr, apart from rdma-core's,
# with the dependencies of the binaries.
#   install_test.sh TOOLS_INSTALL TOOLS_PACKAGE RDMAEMU LIBIBVERBS LIBRDMACM INTERPOSER
set -u
install_sh="$1" package_sh="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
check() { checks=$((checks + 1)); "$@" || fail "$*"; }

from="$tmp/built"
mkdir -p "$from"
cp "$3" "$4" "$5" "$6" "$from/"
prefix="$tmp/prefix"
if ! "$install_sh" --prefix "$prefix" --from "$from" >"$tmp/install.log" 2>&1; then
  fail "tools/install failed:"; sed 's/^/    /' "$tmp/install.log"
  echo "$checks checks, $failures failures"; exit 1
fi
for f in bin/rdmaemu lib/rdmaemu/libibverbs.so.1 lib/rdmaemu/librdmacm.so.1 \
         lib/rdmaemu/librdmaemu_interpose.so \
         include/rdmaemu/rdmaemu.h lib/pkgconfig/rdmaemu.pc share/man/man1/rdmaemu.1 \
         share/man/man3/rdmaemu.3; do
  check test -r "$prefix/$f"
done

# The installed tool, with nothing pointing it at Bazel's outputs.
emu() { env -u RUNFILES_DIR -u RUNFILES_MANIFEST_FILE -u RDMAEMU_LIB "$prefix/bin/rdmaemu" "$@"; }
ld=$(cd / && emu run -- /usr/bin/env | sed -n 's/^LD_LIBRARY_PATH=\([^:]*\).*/\1/p')
checks=$((checks + 1))
[[ "$ld" == "$prefix/lib/rdmaemu" ]] ||
  fail "rdmaemu run put '$ld' first on LD_LIBRARY_PATH, not $prefix/lib/rdmaemu"
# --check preloads the installed interposer (freed-registered-memory).
preload=$(cd / && emu run --check -- /usr/bin/env | sed -n 's/^LD_PRELOAD=//p')
checks=$((checks + 1))
[[ "$preload" == "$prefix/lib/rdmaemu/librdmaemu_interpose.so" ]] ||
  fail "rdmaemu run --check set LD_PRELOAD to '$preload', not $prefix/lib/rdmaemu/librdmaemu_interpose.so"
checks=$((checks + 1))
emu devices >"$tmp/devices.out" 2>&1 && grep -q '^emu0 ' "$tmp/devices.out" ||
  { fail "the installed rdmaemu devices:"; sed 's/^/    /' "$tmp/devices.out"; }

if command -v ibv_rc_pingpong >/dev/null; then
  port=$(( 20000 + RANDOM % 20000 ))
  (cd / && timeout 60 "$prefix/bin/rdmaemu" run -- ibv_rc_pingpong -g 0 -p "$port" -n 100 \
      >"$tmp/server.out" 2>&1) &
  server=$!
  sleep 0.5
  checks=$((checks + 1))
  if ! (cd / && emu run -- timeout 60 ibv_rc_pingpong -g 0 -p "$port" -n 100 127.0.0.1 \
        >"$tmp/client.out" 2>&1); then
    fail "ibv_rc_pingpong through the installed rdmaemu:"; sed 's/^/    /' "$tmp/client.out"
  fi
  wait "$server" || { fail "the pingpong server failed:"; sed 's/^/    /' "$tmp/server.out"; }
  checks=$((checks + 1))
  grep -q 'iters in' "$tmp/client.out" || fail "no pingpong result from the client"
else
  fail "ibv_rc_pingpong is not installed (tools/setup installs ibverbs-utils)"
fi

checks=$((checks + 1))
MANPAGER=cat MAN_DISABLE_SECCOMP=1 man -l "$prefix/share/man/man1/rdmaemu.1" 2>/dev/null |
  grep -q 'rdmaemu run' || fail "the installed rdmaemu(1) does not render"
checks=$((checks + 1))
grep -qx "prefix=$prefix" "$prefix/lib/pkgconfig/rdmaemu.pc" ||
  fail "rdmaemu.pc does not name the prefix: $(head -1 "$prefix/lib/pkgconfig/rdmaemu.pc")"
if command -v pkg-config >/dev/null; then
  checks=$((checks + 1))
  cflags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags rdmaemu)
  [[ "$cflags" == *"-I$prefix/include"* ]] || fail "pkg-config --cflags rdmaemu: '$cflags'"
fi

# The package: the same files under /usr, nothing of rdma-core's, depends
# on what the binaries link.
if deb=$("$package_sh" --from "$from" --output "$tmp/deb" 2>"$tmp/package.err"); then
  dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./||' >"$tmp/deb.files"
  for f in usr/bin/rdmaemu usr/lib/rdmaemu/libibverbs.so.1 usr/lib/rdmaemu/librdmacm.so.1 \
           usr/lib/rdmaemu/librdmaemu_interpose.so \
           usr/include/rdmaemu/rdmaemu.h usr/share/man/man1/rdmaemu.1; do
    checks=$((checks + 1))
    grep -qx "$f" "$tmp/deb.files" || fail "the package lacks /$f"
  done
  checks=$((checks + 1))
  if grep -E '^usr/lib/[^/]*-linux-gnu/|^usr/lib/libibverbs|^etc/' "$tmp/deb.files"; then
    fail "the package puts files where rdma-core's are"
  fi
  checks=$((checks + 1))
  depends=$(dpkg-deb -f "$deb" Depends)
  for p in liburing2 libspdlog1.10 libfmt9; do
    [[ "$depends" == *"$p"* ]] || fail "the package's Depends ($depends) lacks $p"
  done
  checks=$((checks + 1))
  [[ "$(dpkg-deb -f "$deb" Package)" == rdmaemu ]] || fail "the package is not named rdmaemu"
else
  fail "tools/package failed:"; sed 's/^/    /' "$tmp/package.err"
fi

echo "$checks checks, $failures failures"
[[ $failures -eq 0 ]]
