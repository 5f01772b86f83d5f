#!/bin/bash
# Debian's unmodified ibv_devices and ibv_devinfo, run through `rdmaemu run`
# with no configuration, see the default device: emu0, one active RoCE v2
# port on a loopback address, active MTU 4096.
source "$(dirname "$0")/e2e_lib.sh"
need ibv_devices ibv_devinfo

t devices 0 "$rdmaemu" run -- ibv_devices && {
  has devices "$out" '^[[:space:]]+device[[:space:]]+node GUID'
  has devices "$out" '^[[:space:]]+emu0[[:space:]]+[0-9a-f]{16}$'
  hasnt devices "$out" '^[[:space:]]+emu0[[:space:]]+0{16}$'
}

t devinfo 0 "$rdmaemu" run -- ibv_devinfo -v && {
  has devinfo "$out" '^hca_id:[[:space:]]emu0$'
  has devinfo "$out" $'^\ttransport:\t\t\tInfiniBand \\(0\\)$'
  has devinfo "$out" $'^\t\tport:\t1$'
  has devinfo "$out" $'^\t\t\tstate:\t\t\tPORT_ACTIVE \\(4\\)$'
  has devinfo "$out" $'^\t\t\tactive_mtu:\t\t4096 \\(5\\)$'
  has devinfo "$out" $'^\t\t\tmax_mtu:\t\t4096 \\(5\\)$'
  has devinfo "$out" $'^\t\t\tlink_layer:\t\tEthernet$'
  has devinfo "$out" $'^\t\t\tsm_lid:\t\t\t0$'
  has devinfo "$out" $'^\t\t\tport_lid:\t\t0$'
  has devinfo "$out" 'GID\[  0\]:[[:space:]]+::ffff:127\.[0-9]+\.[0-9]+\.[0-9]+, RoCE v2$'
  has devinfo "$out" $'^\tnode_guid:\t\t\t[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}:[0-9a-f]{4}$'
  hasnt devinfo "$out" $'^\tnode_guid:\t\t\t0000:0000:0000:0000$'
  # Our own vendor id, never Mellanox's (0x02c9): perftest keys off it.
  hasnt devinfo "$out" $'^\tvendor_id:\t\t\t0x02c9$'
  hasnt devinfo "$err" 'error|Segmentation|symbol lookup'
}

# One port: -i 1 works, -i 2 fails cleanly (ibv_devinfo's own message).
t port1 0 "$rdmaemu" run -- ibv_devinfo -d emu0 -i 1 && {
  has port1 "$out" '^hca_id:[[:space:]]emu0$'
  has port1 "$out" $'^\t\tport:\t1$'
  has port1 "$out" 'PORT_ACTIVE'
}
t port2 fail "$rdmaemu" run -- ibv_devinfo -d emu0 -i 2 && {
  has port2 "$err" '.'
  hasnt port2 "$out" 'PORT_ACTIVE'
}
t no_such_device fail "$rdmaemu" run -- ibv_devinfo -d mlx5_0 && has no_such_device "$err" "mlx5_0"

# The same device through the tool's own listing.
t tool_devices 0 "$rdmaemu" devices && {
  has tool_devices "$out" '^DEVICE +NODE GUID +PORT +STATE +LINK LAYER +MTU +RATE +LID +GID\[0\] ADDRESS +GID TYPE +MAC$'
  has tool_devices "$out" '^emu0 +[0-9a-f]{16} +1 +ACTIVE +Ethernet +4096 +4x EDR +0 +127\.[0-9.]+ \(auto\) +RoCE v2 +02:00:7f(:[0-9a-f]{2}){3}$'
}

# --address sets the GID; the program sees it.
t address 0 "$rdmaemu" run --address 127.0.0.77 -- ibv_devinfo -v && \
  has address "$out" 'GID\[  0\]:[[:space:]]+::ffff:127\.0\.0\.77, RoCE v2$'

# The library on the path is ours, not /usr/lib's (ld.so says which it loaded).
t which_lib 0 env LD_DEBUG=libs "$rdmaemu" run -- ibv_devices && {
  ours=$(readlink -f "$lib")
  loaded=$(sed -n 's/.*calling init: \(.*libibverbs\.so\.1\)$/\1/p' "$err" | head -1)
  checks=$((checks + 1))
  [[ -n "$loaded" && "$(readlink -f "$loaded")" == "$ours" ]] || fail "which_lib: loaded '$loaded', not $ours"
}

finish
