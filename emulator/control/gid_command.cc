// `gid DEV PORT INDEX set GID | clear`: changes one entry of a port's GID
// table, as adding or removing an address on a RoCE interface does
// (GID_CHANGE). The device checks the entry and the GID (Device::SetGid),
// exactly as for rdmaemu_set_gid.
#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kGidCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: gid DEV PORT INDEX set GID\n"
    "       gid DEV PORT INDEX clear\n"
    "Sets or clears entry INDEX (1..15) of the GID table of port PORT of device\n"
    "DEV, as adding or removing an address on a RoCE interface does; every\n"
    "context of the device gets GID_CHANGE (none when nothing changes).\n"
    "GID is an IPv6 address (fe80::1, or the eight groups ibv_devinfo -v\n"
    "prints) or an IPv4 address, which becomes ::ffff:a.b.c.d as in a RoCEv2\n"
    "GID table. Entry 0 is the port's own address and cannot change.\n";

Result<device::Gid> ParseGid(std::string_view word) {
  const std::string text(word);
  device::Gid gid;
  if (::inet_pton(AF_INET6, text.c_str(), gid.raw.data()) == 1) return gid;
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) return device::Gid::FromIpv4(v4);
  return InvalidArgument(fmt::format("'{}' is not a GID (an IPv6 address such as fe80::1, or an IPv4 "
                                     "address such as 192.0.2.1)",
                                     word));
}

std::string GidText(Result<device::Gid> gid) {
  if (!gid.ok()) return "empty";
  char text[INET6_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET6, gid->raw.data(), text, sizeof text);
  return text;
}

Reply GidMain(std::span<const std::string> args) {
  if (args.size() < 4) return UsageError(kGidCommand, "expected DEV PORT INDEX set GID | clear");
  auto dev = FindDevice(args[0]);
  if (!dev.ok()) return FromStatus("gid", dev.status());
  device::Device& d = **dev;
  auto port = ParsePort(d, args[1]);
  if (!port.ok()) return FromStatus("gid", port.status());
  auto index = ParseNumber(args[2], 0xffff);
  if (!index.ok()) return UsageError(kGidCommand, fmt::format("INDEX: {}", index.status().message()));
  const std::string& action = args[3];
  const size_t want = action == "set" ? 5 : 4;
  if (action != "set" && action != "clear") {
    return UsageError(kGidCommand, fmt::format("unknown action '{}' (actions: set, clear)", action));
  }
  if (args.size() != want) {
    return UsageError(kGidCommand, fmt::format("'{}' takes {} value(s), got {}", action, want - 4,
                                               args.size() - 4));
  }
  const int i = static_cast<int>(*index);
  const std::string before = GidText(d.QueryGid(*port, i));
  Status s;
  if (action == "set") {
    auto gid = ParseGid(args[4]);
    if (!gid.ok()) return UsageError(kGidCommand, gid.status().message());
    s = d.SetGid(*port, i, *gid);
  } else {
    s = d.ClearGid(*port, i);
  }
  if (!s.ok()) return FromStatus("gid", s);
  const std::string after = GidText(d.QueryGid(*port, i));
  const std::string prefix = fmt::format("{} port {}: GID[{}]", d.name(), *port, i);
  if (before == after) return Ok(fmt::format("{} already {}\n", prefix, after));
  return Ok(fmt::format("{} {} (was {})\n", prefix, after, before));
}

}  // namespace

const Command kGidCommand = {"gid", "set or clear a GID table entry of a port", kUsage, GidMain};

}  // namespace rdmaemu::control
