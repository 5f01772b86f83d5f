#!/bin/bash
# `rdmaemu run` shows the program the emulated devices under
# /sys/class/infiniband (tools/rdmaemu/sysfs_view.h, docs/sysfs.md):
#   - as root: the default device's netdev is lo, its files hold what the
#     kernel's would (the GUID is the program's own: ibv_devinfo exec'd in
#     the same process prints it), /sys/class/net and the rest of /sys/class
#     read as before, a configuration's devices all appear (a fixed address
#     with its GID and netdev, a device that cannot open without ports/),
#     the files cannot be written, nothing is left mounted outside, and
#     --no-sysfs leaves /sys alone;
#   - as nobody (setpriv): the view through a user namespace if the kernel
#     allows one (asked with `unshare -U -m true` as nobody), else one
#     warning line and the program runs anyway; and, as root can arrange,
#     once inside a user namespace whose user.max_user_namespaces is 0, where
#     the warning must come.
# Without root, the nobody checks run as the caller.
# Usage: sysfs_view_test.sh RDMAEMU LIBIBVERBS
set -u
tool="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
lib="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# t NAME WANT CMD...: runs CMD; stdout in $out, stderr in $err.
t() {
  local name="$1" want="$2"
  shift 2
  checks=$((checks + 1))
  out="$tmp/$name.out"
  err="$tmp/$name.err"
  timeout 60 "$@" >"$out" 2>"$err"
  local rc=$?
  if [[ "$rc" != "$want" ]]; then
    fail "$name: exit status $rc, want $want; stdout, stderr:"
    sed 's/^/    /' "$out" | head -20
    sed 's/^/    /' "$err" | head -20
    return 1
  fi
  return 0
}
has() {  # has NAME FILE ERE
  checks=$((checks + 1))
  if ! grep -qE -- "$3" "$2"; then
    fail "$1: no line matching '$3' in $(basename "$2"):"
    sed 's/^/    /' "$2" | head -30
  fi
}
hasnt() {  # hasnt NAME FILE ERE
  checks=$((checks + 1))
  if grep -qE -- "$3" "$2"; then
    fail "$1: a line matches '$3' in $(basename "$2"):"
    grep -E -- "$3" "$2" | sed 's/^/    /' | head -5
  fi
}
same() {  # same NAME FILE1 FILE2
  checks=$((checks + 1))
  if ! diff -u "$2" "$3" >"$tmp/diff" 2>&1; then
    fail "$1: $(basename "$2") and $(basename "$3") differ:"
    sed 's/^/    /' "$tmp/diff" | head -20
  fi
}

unset RDMAEMU_CONFIG RDMAEMU_ADDRESS RDMAEMU_UDP_PORT RDMAEMU_LIB RDMAEMU_FAULTS RDMAEMU_PCAP RDMAEMU_CHECK
export RDMAEMU_LOG=warn
ib=/sys/class/infiniband
had_ib=0
[[ -e $ib ]] && had_ib=1
mounts_before=$(grep -c . /proc/self/mountinfo)

# Fixed addresses and a UDP port of this run's own, so that tests running at
# the same time do not collide.
port=$((20000 + RANDOM % 20000))
a=$((RANDOM % 160 + 20))  # an InfiniBand port's LID is the low 16 bits: unicast
b=$((RANDOM % 250 + 1))
fixed="127.77.$a.$b"
fixed_gid=$(printf '0000:0000:0000:0000:0000:ffff:7f4d:%02x%02x' "$a" "$b")

if [[ $EUID -eq 0 ]]; then
  run=("$tool" run --lib "$lib")

  # --- the default device
  t default_net 0 "${run[@]}" -- ls $ib/emu0/device/net/ && {
    checks=$((checks + 1))
    [[ "$(cat "$out")" == lo ]] || fail "default_net: device/net/ lists '$(cat "$out")', want lo"
  }
  t default_files 0 "${run[@]}" -- sh -c "cd $ib/emu0 && for f in node_type fw_ver hca_type ports/1/state ports/1/phys_state ports/1/link_layer ports/1/rate ports/1/lid ports/1/sm_lid ports/1/gid_attrs/types/0 ports/1/gid_attrs/ndevs/0; do echo \"\$f=\$(cat \$f)\"; done; ls ports/1/gids | wc -l" && {
    has default_files "$out" '^node_type=1: CA$'
    has default_files "$out" '^fw_ver=rdmaemu '
    has default_files "$out" '^hca_type=rdmaemu$'
    has default_files "$out" '^ports/1/state=4: ACTIVE$'
    has default_files "$out" '^ports/1/phys_state=5: LinkUp$'
    has default_files "$out" '^ports/1/link_layer=Ethernet$'
    has default_files "$out" '^ports/1/rate=100 Gb/sec \(4X EDR\)$'
    has default_files "$out" '^ports/1/lid=0x0$'
    has default_files "$out" '^ports/1/sm_lid=0x0$'
    has default_files "$out" '^ports/1/gid_attrs/types/0=RoCE v2$'
    has default_files "$out" '^ports/1/gid_attrs/ndevs/0=lo$'
    # An automatic address is picked at open: no gids/0 to show yet.
    has default_files "$out" '^0$'
  }
  t link_layer 0 "${run[@]}" -- cat $ib/emu0/ports/1/link_layer && has link_layer "$out" '^Ethernet$'
  # The view's netdev link leads to the netdev's own directory.
  t net_link 0 "${run[@]}" -- cat $ib/emu0/device/net/lo/ifindex && has net_link "$out" '^1$'
  t read_only 0 "${run[@]}" -- sh -c "ls -l $ib/emu0/node_type; echo x 2>/dev/null >$ib/emu0/node_type || echo refused; mkdir $ib/x 2>/dev/null || echo refused" && {
    has read_only "$out" '^-r--r--r-- '
    checks=$((checks + 1))
    [[ $(grep -c '^refused$' "$out") -eq 2 ]] || fail "read_only: a write into the view succeeded: $(cat "$out")"
  }

  # The GUID is the program's own: sh prints the file, then becomes
  # ibv_devinfo (exec: the same process, so the same GUID).
  if command -v ibv_devinfo >/dev/null; then
    t guid 0 "${run[@]}" -- sh -c "cat $ib/emu0/node_guid $ib/emu0/sys_image_guid; exec ibv_devinfo -d emu0" && {
      g=$(sed -n 1p "$out")
      checks=$((checks + 1))
      [[ $g =~ ^[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}$ ]] || fail "guid: node_guid is '$g'"
      has guid "$out" "^[[:space:]]+node_guid:[[:space:]]+$g\$"
      has guid "$out" "^[[:space:]]+sys_image_guid:[[:space:]]+$g\$"
    }
  else
    echo "note: ibv_devinfo is not installed; the GUID is not compared"
  fi

  # --- the rest of /sys/class reads as before
  ls /sys/class >"$tmp/class.outside"
  ls /sys/class/net >"$tmp/net.outside"
  t class 0 "${run[@]}" -- ls /sys/class && {
    if (( had_ib )); then same class "$tmp/class.outside" "$out"
    else
      grep -vx infiniband "$out" >"$tmp/class.inside"
      same class "$tmp/class.outside" "$tmp/class.inside"
      has class "$out" '^infiniband$'
    fi
  }
  t class_net 0 "${run[@]}" -- ls /sys/class/net && { same class_net "$tmp/net.outside" "$out"; has class_net "$out" '^lo$'; }
  t class_net_read 0 "${run[@]}" -- cat /sys/class/net/lo/operstate

  # --- a configuration: every device, fixed addresses with their GID and
  # netdev, a device that cannot open (its address is no one's here).
  cfg="$tmp/devices.conf"
  {
    echo "device emu0"
    echo "port address=$fixed udp_port=$port"
    echo "port state=down width=1x speed=fdr udp_port=$port"
    echo "device emu1"
    echo "port link_layer=infiniband address=$fixed udp_port=$((port + 1))"
  } >"$cfg"
  # A non-loopback address of this machine, if it has one.
  eth=$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print $2, a[1]; exit}')
  if [[ -n $eth ]]; then
    read -r eth_if eth_ip <<<"$eth"
    printf 'device emu2\nport address=%s udp_port=%s\n' "$eth_ip" "$((port + 2))" >>"$cfg"
  else
    echo "note: no global IPv4 address here; a device on an Ethernet netdev is not tried"
  fi
  printf 'device emu9\nport address=203.0.113.77 udp_port=%s\n' "$port" >>"$cfg"
  t config 0 "${run[@]}" --config "$cfg" -- sh -c "cd $ib && ls; for f in \$(find . -type f | sort); do echo \"\$f=\$(cat \$f)\"; done; find . -type l | sort" && {
    has config "$out" '^emu0$'
    has config "$out" '^emu1$'
    has config "$out" '^emu9$'
    has config "$out" "^./emu0/ports/1/gids/0=$fixed_gid\$"
    has config "$out" '^./emu0/ports/2/state=1: DOWN$'
    has config "$out" '^./emu0/ports/2/phys_state=3: Disabled$'
    has config "$out" '^./emu0/ports/2/rate=14 Gb/sec \(1X FDR\)$'
    has config "$out" '^./emu0/device/net/lo$'
    has config "$out" '^./emu1/ports/1/link_layer=InfiniBand$'
    has config "$out" "^./emu1/ports/1/lid=0x$(printf '%x' "$((a * 256 + b))")\$"
    has config "$out" '^./emu1/ports/1/sm_lid=0x1$'
    has config "$out" '^./emu1/ports/1/gid_attrs/types/0=IB/RoCE v1$'
    hasnt config "$out" '^./emu1/device/net/'
    has config "$out" '^./emu9/node_guid=[0-9a-f:]{19}$'
    hasnt config "$out" '^./emu9/ports/'
    if [[ -n $eth ]]; then
      has config "$out" "^./emu2/device/net/$eth_if\$"
      has config "$out" "^./emu2/ports/1/gid_attrs/ndevs/0=$eth_if\$"
    fi
    has config "$err" '^rdmaemu run: warning: /sys/class/infiniband/emu9: ibv_open_device failed \(Cannot assign requested address\), so it has no ports/ there$'
    checks=$((checks + 1))
    [[ $(grep -c . "$err") -eq 1 ]] || fail "config: more on stderr than the one warning: $(cat "$err")"
  }

  # --- --no-sysfs: /sys as it is
  t no_sysfs 0 "${run[@]}" --no-sysfs -- sh -c "ls $ib 2>&1; ls /sys/class" && {
    if (( had_ib )); then ls $ib >"$tmp/ib.outside"; sed -n "1,$(grep -c . "$tmp/ib.outside")p" "$out" >"$tmp/ib.inside"; same no_sysfs "$tmp/ib.outside" "$tmp/ib.inside"
    else has no_sysfs "$out" 'No such file or directory'; hasnt no_sysfs "$out" '^infiniband$'; fi
  }

  # --- nothing stays mounted outside
  checks=$((checks + 1))
  if (( ! had_ib )) && [[ -e $ib ]]; then fail "outside: $ib exists after the runs"; fi
  checks=$((checks + 1))
  grep -q ' - tmpfs rdmaemu ' /proc/self/mountinfo && fail "outside: the view's tmpfs is mounted here: $(grep ' - tmpfs rdmaemu ' /proc/self/mountinfo)"
  checks=$((checks + 1))
  [[ $(grep -c . /proc/self/mountinfo) -eq $mounts_before ]] || fail "outside: $mounts_before mounts before, $(grep -c . /proc/self/mountinfo) after"

  # --- unprivileged: the tool and library copied where nobody can read them
  # (the runfiles are under root's home).
  shared=$(mktemp -d /tmp/rdmaemu-sysfs-test.XXXXXX)
  trap 'rm -rf "$shared"' EXIT
  cp "$tool" "$shared/rdmaemu"
  cp -L "$lib" "$shared/libibverbs.so.1"
  chmod -R a+rX "$shared"
  as_nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  user_tool="$shared/rdmaemu"
  user_lib="$shared"
else
  as_nobody=()
  user_tool="$tool"
  user_lib="$(dirname "$lib")"
fi

who=$([[ $EUID -eq 0 ]] && echo nobody || id -un)
if (cd / && "${as_nobody[@]}" unshare -U -m true) 2>/dev/null; then
  t user_view 0 env -C / "${as_nobody[@]}" "$user_tool" run --lib "$user_lib" -- sh -c "id -u; ls $ib/emu0/device/net/; cat $ib/emu0/ports/1/link_layer; ls /sys/class/net" && {
    has user_view "$out" "^$( [[ $EUID -eq 0 ]] && echo 65534 || id -u)\$"
    has user_view "$out" '^lo$'
    has user_view "$out" '^Ethernet$'
    checks=$((checks + 1))
    [[ -s "$err" ]] && fail "user_view: stderr is not empty: $(cat "$err")"
  }
else
  echo "note: the kernel refuses $who a user namespace here; the warning is expected"
  t user_view 0 env -C / "${as_nobody[@]}" "$user_tool" run --lib "$user_lib" -- sh -c "id -u; ls $ib 2>&1 | head -1" && {
    has user_view "$err" '^rdmaemu run: warning: sh will not see /sys/class/infiniband: .+: .+; --no-sysfs hides this warning$'
    checks=$((checks + 1))
    [[ $(grep -c . "$err") -eq 1 ]] || fail "user_view: want one warning line, got: $(cat "$err")"
  }
fi
t user_no_sysfs 0 env -C / "${as_nobody[@]}" "$user_tool" run --lib "$user_lib" --no-sysfs -- true && {
  checks=$((checks + 1))
  [[ -s "$err" ]] && fail "user_no_sysfs: stderr is not empty: $(cat "$err")"
}

# --- the warning, for certain: nobody inside a user namespace that may have
# no more of them (user.max_user_namespaces is per user namespace, and its
# root may lower it). Only root can map nobody into it.
if [[ $EUID -eq 0 ]] && command -v python3 >/dev/null; then
  cat >"$tmp/no_userns.py" <<'PY'
# no_userns.py CMD...: CMD as uid/gid 65534 in a user namespace whose
# user.max_user_namespaces is 0. Exit 3: this kernel would not set it up.
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(w); os.close(ready_r)
    if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
        os._exit(3)
    os.write(ready_w, b"x")
    if os.read(r, 1) != b"x":
        os._exit(3)
    try:
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
    except OSError:
        os._exit(3)
    os.execvp(sys.argv[1], sys.argv[1:])
os.close(r); os.close(ready_w)
if os.read(ready_r, 1) == b"x":
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write("0 0 1\n65534 65534 1\n")
    os.write(w, b"x")
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
PY
  (cd / && python3 "$tmp/no_userns.py" true) 2>/dev/null
  rc=$?
  if [[ $rc -eq 3 ]]; then
    echo "note: this kernel would not make the namespace without user namespaces; the forced warning is not checked"
  else
    t refused 0 env -C / python3 "$tmp/no_userns.py" "$user_tool" run --lib "$user_lib" -- sh -c "id -u; ls $ib 2>&1; true" && {
      has refused "$out" '^65534$'
      has refused "$out" 'No such file or directory'
      has refused "$err" '^rdmaemu run: warning: sh will not see /sys/class/infiniband: unshare\(CLONE_NEWUSER\|CLONE_NEWNS\): No space left on device \(no unprivileged user namespaces here: .*\); --no-sysfs hides this warning$'
      checks=$((checks + 1))
      [[ $(grep -c . "$err") -eq 1 ]] || fail "refused: want one warning line, got: $(cat "$err")"
    }
  fi
fi

echo "$checks checks, $failures failures"
[[ $failures -eq 0 ]]
