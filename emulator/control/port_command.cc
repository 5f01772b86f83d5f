// `port DEV PORT ACTION [VALUE...]`: acts on one port of an open device, as
// a cable, the subnet manager or link training would.
//
// The actions are a table: adding one is a row below plus its function,
// and a line in kUsage. Each action parses its words, then calls the same
// Device mutator as the C API (rdmaemu/rdmaemu.h), which checks the values:
// what the device refuses is refused here with the device's own message.
#include <cctype>
#include <optional>

#include <fmt/format.h>

#include "emulator/control/command.h"
#include "emulator/device/config.h"

namespace rdmaemu::control {

extern const Command kPortCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: port DEV PORT ACTION [VALUE...]\n"
    "Acts on port PORT (1, 2) of device DEV (emu0, ...), as a cable, the subnet\n"
    "manager or link training would; every context of the device gets the async\n"
    "event (none when nothing changes).\n"
    "Actions:\n"
    "  down              the port goes DOWN: PORT_ERR; no packet crosses it\n"
    "  up                the port goes ACTIVE: PORT_ACTIVE\n"
    "  lid N             the port's LID becomes N (1..0xbfff): LID_CHANGE\n"
    "  sm_lid N          the subnet manager's LID becomes N: SM_CHANGE\n"
    "  rereg             the subnet manager asks clients to reregister:\n"
    "                    CLIENT_REREGISTER\n"
    "  pkey INDEX VALUE  P_Key table entry INDEX (0..15) becomes VALUE (0 empties\n"
    "                    it; 0x8001 is a full member of partition 1): PKEY_CHANGE\n"
    "  speed SPEED       the link's active speed: sdr ddr qdr fdr10 fdr edr hdr ndr,\n"
    "                    or the lane rate ibv_devinfo prints (2.5 5.0 10.0 14.0 25.0\n"
    "                    50.0 100.0, optionally with Gbps): DEVICE_SPEED_CHANGE\n"
    "  width WIDTH       the link's active width: 1x 2x 4x 8x 12x: DEVICE_SPEED_CHANGE\n"
    "lid, sm_lid, rereg and pkey need a port with link_layer=infiniband (a RoCE\n"
    "port has no LIDs, subnet manager or P_Key table). Numbers are decimal or\n"
    "0x-hex.\n";

using Values = std::span<const std::string>;

struct PortAction {
  std::string_view name;
  int values;  // how many words follow the action
  Reply (*run)(device::Device& dev, int port, Values values);
};

// A value word of an action; the usage error names the action and the word.
Result<uint64_t> Number(std::string_view action, std::string_view word, uint64_t max) {
  auto n = ParseNumber(word, max);
  if (!n.ok()) return InvalidArgument(fmt::format("{}: {}", action, n.status().message()));
  return n;
}

std::string Prefix(const device::Device& dev, int port) { return fmt::format("{} port {}:", dev.name(), port); }

// "... X (was Y)" or "... already X": the device raises no event when
// nothing changes, and says so.
Reply Changed(const device::Device& dev, int port, std::string_view what, const std::string& before,
              const std::string& after) {
  if (before == after) return Ok(fmt::format("{} {} already {}\n", Prefix(dev, port), what, after));
  return Ok(fmt::format("{} {} {} (was {})\n", Prefix(dev, port), what, after, before));
}

Reply SetState(device::Device& dev, int port, device::PortState state) {
  device::PortState before = dev.QueryPort(port).state;
  if (Status s = dev.SetPortState(port, state); !s.ok()) return FromStatus("port", s);
  if (before == state) return Ok(fmt::format("{} already {}\n", Prefix(dev, port), ToString(state)));
  return Ok(fmt::format("{} {} (was {})\n", Prefix(dev, port), ToString(state), ToString(before)));
}

Reply Down(device::Device& dev, int port, Values) { return SetState(dev, port, device::PortState::kDown); }
Reply Up(device::Device& dev, int port, Values) { return SetState(dev, port, device::PortState::kActive); }

Reply Lid(device::Device& dev, int port, Values v) {
  auto lid = Number("lid", v[0], 0xffff);
  if (!lid.ok()) return UsageError(kPortCommand, lid.status().message());
  const uint16_t before = dev.QueryPort(port).lid;
  if (Status s = dev.SetLid(port, static_cast<uint16_t>(*lid)); !s.ok()) return FromStatus("port", s);
  return Changed(dev, port, "LID", std::to_string(before), std::to_string(*lid));
}

Reply SmLid(device::Device& dev, int port, Values v) {
  auto lid = Number("sm_lid", v[0], 0xffff);
  if (!lid.ok()) return UsageError(kPortCommand, lid.status().message());
  const uint16_t before = dev.QueryPort(port).sm_lid;
  if (Status s = dev.SetSmLid(port, static_cast<uint16_t>(*lid)); !s.ok()) return FromStatus("port", s);
  return Changed(dev, port, "SM LID", std::to_string(before), std::to_string(*lid));
}

Reply Rereg(device::Device& dev, int port, Values) {
  if (Status s = dev.ClientReregister(port); !s.ok()) return FromStatus("port", s);
  return Ok(fmt::format("{} clients asked to reregister\n", Prefix(dev, port)));
}

Reply Pkey(device::Device& dev, int port, Values v) {
  auto index = Number("pkey INDEX", v[0], 0xffff);
  if (!index.ok()) return UsageError(kPortCommand, index.status().message());
  auto pkey = Number("pkey VALUE", v[1], 0xffff);
  if (!pkey.ok()) return UsageError(kPortCommand, pkey.status().message());
  // Read first for the "was"; an index outside the table is the device's
  // refusal (from the set, so the message names the operation).
  auto before = dev.QueryPkey(port, static_cast<int>(*index));
  if (Status s = dev.SetPkey(port, static_cast<int>(*index), static_cast<uint16_t>(*pkey)); !s.ok()) {
    return FromStatus("port", s);
  }
  return Changed(dev, port, fmt::format("P_Key[{}]", *index), fmt::format("{:#06x}", before.ok() ? *before : 0),
                 fmt::format("{:#06x}", *pkey));
}

std::string LinkText(uint8_t speed, uint8_t width) {
  std::string w(device::WidthName(width)), s(device::SpeedName(speed));
  for (char& c : w) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return fmt::format("{} {} ({} Gbps per lane)", w, s, device::SpeedRate(speed));
}

Reply SetLink(device::Device& dev, int port, std::optional<uint8_t> speed, std::optional<uint8_t> width) {
  const device::PortAttr before = dev.QueryPort(port);
  const uint8_t new_speed = speed.value_or(before.speed), new_width = width.value_or(before.width);
  if (Status s = dev.SetLinkSpeed(port, new_speed, new_width); !s.ok()) return FromStatus("port", s);
  return Changed(dev, port, "link", LinkText(before.speed, before.width), LinkText(new_speed, new_width));
}

Reply Speed(device::Device& dev, int port, Values v) {
  auto speed = device::ParseSpeed(v[0]);
  if (!speed.ok()) return UsageError(kPortCommand, speed.status().message());
  return SetLink(dev, port, *speed, std::nullopt);
}

Reply Width(device::Device& dev, int port, Values v) {
  auto width = device::ParseWidth(v[0]);
  if (!width.ok()) return UsageError(kPortCommand, width.status().message());
  return SetLink(dev, port, std::nullopt, *width);
}

constexpr PortAction kActions[] = {
    {"down", 0, Down},   {"up", 0, Up},       {"lid", 1, Lid},     {"sm_lid", 1, SmLid},
    {"rereg", 0, Rereg}, {"pkey", 2, Pkey},   {"speed", 1, Speed}, {"width", 1, Width},
};

std::string ActionNames() {
  std::vector<std::string_view> names;
  for (const PortAction& a : kActions) names.push_back(a.name);
  return fmt::format("{}", fmt::join(names, ", "));
}

Reply PortMain(std::span<const std::string> args) {
  if (args.size() < 3) return UsageError(kPortCommand, "expected DEV PORT ACTION");
  auto dev = FindDevice(args[0]);
  if (!dev.ok()) return FromStatus("port", dev.status());
  auto port = ParsePort(**dev, args[1]);
  if (!port.ok()) return FromStatus("port", port.status());
  for (const PortAction& a : kActions) {
    if (a.name != args[2]) continue;
    auto values = args.subspan(3);
    if (static_cast<int>(values.size()) != a.values) {
      return UsageError(kPortCommand, fmt::format("'{}' takes {} value(s), got {}", a.name, a.values,
                                                  values.size()));
    }
    return a.run(**dev, *port, values);
  }
  return UsageError(kPortCommand, fmt::format("unknown action '{}' (actions: {})", args[2], ActionNames()));
}

}  // namespace

const Command kPortCommand = {"port", "take a port down or up, change its LID, SM, P_Keys, speed or width",
                              kUsage, PortMain};

}  // namespace rdmaemu::control
