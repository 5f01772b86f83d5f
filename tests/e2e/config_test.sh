#!/bin/bash
# Configuration reaches unmodified programs: a file with two devices shows
# both, in ibv_devices, ibv_devinfo and `rdmaemu devices`; a file with a
# mistake makes ibv_devices fail with a message naming the file and line.
source "$(dirname "$0")/e2e_lib.sh"
need ibv_devices ibv_devinfo

two="$tmp/two.conf"
cat >"$two" <<'CONF'
# two devices, the second with two ports
device emu0
port address=127.0.0.41
device emu1
port address=127.0.0.42 mtu=2048
port address=127.0.0.43 state=down
CONF

t devices_env 0 env RDMAEMU_CONFIG="$two" "$rdmaemu" run -- ibv_devices && {
  has devices_env "$out" '^[[:space:]]+emu0[[:space:]]+[0-9a-f]{16}$'
  has devices_env "$out" '^[[:space:]]+emu1[[:space:]]+[0-9a-f]{16}$'
}
t devices_opt 0 "$rdmaemu" run --config "$two" -- ibv_devices && {
  has devices_opt "$out" '^[[:space:]]+emu0[[:space:]]'
  has devices_opt "$out" '^[[:space:]]+emu1[[:space:]]'
}
t devinfo_two 0 "$rdmaemu" run --config "$two" -- ibv_devinfo -d emu1 -v && {
  has devinfo_two "$out" '^hca_id:[[:space:]]emu1$'
  has devinfo_two "$out" $'^\t\t\tactive_mtu:\t\t2048 \\(4\\)$'
  has devinfo_two "$out" 'GID\[  0\]:[[:space:]]+::ffff:127\.0\.0\.42, RoCE v2$'
  has devinfo_two "$out" $'^\t\tport:\t2$'
  has devinfo_two "$out" $'^\t\t\tstate:\t\t\tPORT_DOWN \\(1\\)$'
}
t tool_two 0 "$rdmaemu" devices --config "$two" && {
  has tool_two "$out" '^emu0 +[0-9a-f]{16} +1 +ACTIVE +Ethernet +4096 .* 127\.0\.0\.41 +RoCE v2 +[0-9a-f:]{17}$'
  has tool_two "$out" '^emu1 +[0-9a-f]{16} +1 +ACTIVE +Ethernet +2048 .* 127\.0\.0\.42 +RoCE v2 +[0-9a-f:]{17}$'
  has tool_two "$out" '^emu1 +[0-9a-f]{16} +2 +DOWN +Ethernet .* 127\.0\.0\.43 +RoCE v2 +[0-9a-f:]{17}$'
}
# Addresses picked at open are marked, and two such devices listed together
# get two addresses, as in one program that opens both.
auto="$tmp/auto.conf"
printf 'device emu0\nport\ndevice emu1\nport\nport address=127.0.0.43\n' >"$auto"
t tool_auto 0 "$rdmaemu" devices --config "$auto" && {
  has tool_auto "$out" '^emu0 +[0-9a-f]{16} +1 .* 127\.[0-9.]+ \(auto\) +RoCE v2 +[0-9a-f:]{17}$'
  has tool_auto "$out" '^emu1 +[0-9a-f]{16} +1 .* 127\.[0-9.]+ \(auto\) +RoCE v2 +[0-9a-f:]{17}$'
  has tool_auto "$out" '^emu1 +[0-9a-f]{16} +2 .* 127\.0\.0\.43 +RoCE v2 +[0-9a-f:]{17}$'
  has tool_auto "$out" '^\(auto\): the first free address of 127\.0\.0\.0/8'
  # ... ADDRESS (auto) RoCE v2 MAC: the address is the fifth field from the end.
  a0=$(awk '$1 == "emu0" && $3 == 1 {print $(NF-4)}' "$out")
  a1=$(awk '$1 == "emu1" && $3 == 1 {print $(NF-4)}' "$out")
  if [ -z "$a0" ] || [ "$a0" = "$a1" ]; then
    fail "tool_auto: emu0 and emu1 list the same automatic address '$a0'"
  fi
}
t tool_fixed 0 "$rdmaemu" devices --config "$two" && {
  if grep -q auto "$out"; then fail "tool_fixed: a configured address is marked auto"; fi
}

bad="$tmp/bad.conf"
printf 'device emu0\nport address=127.0.0.1\nport mtu=3000\n' >"$bad"
t bad_config fail env RDMAEMU_CONFIG="$bad" "$rdmaemu" run -- ibv_devices && {
  has bad_config "$err" "$bad:3: .*mtu must be 256, 512, 1024, 2048 or 4096, not '3000'"
}
t bad_config_devinfo fail "$rdmaemu" run --config "$bad" -- ibv_devinfo && \
  has bad_config_devinfo "$err" "$bad:3: "
t bad_config_tool 1 "$rdmaemu" devices --config "$bad" && {
  has bad_config_tool "$err" "$bad:3: "
  has bad_config_tool "$err" '^rdmaemu devices: cannot list the devices'
}
printf 'device emu0\nport\nmachine x\n' >"$bad"
t bad_statement fail "$rdmaemu" run --config "$bad" -- ibv_devices && \
  has bad_statement "$err" "$bad:3: unknown statement 'machine'"

# RDMAEMU_WAIT_SPIN_US: microseconds from 0 to 10000, or opening the device
# fails with a line naming the variable and the value.
for spin in fast 10001 -5 1e3; do
  t "bad_spin_$spin" fail env RDMAEMU_WAIT_SPIN_US="$spin" "$rdmaemu" run -- ibv_devinfo && \
    has "bad_spin_$spin" "$err" "error: cannot open emu0: RDMAEMU_WAIT_SPIN_US: '$spin' is not a number of microseconds from 0 to 10000"
done
for spin in 0 10000; do
  t "spin_$spin" 0 env RDMAEMU_WAIT_SPIN_US="$spin" "$rdmaemu" run -- ibv_devinfo && \
    has "spin_$spin" "$out" 'state:[[:space:]]+PORT_ACTIVE'
done

finish
