// `port DEV PORT ACTION [VALUE]`: acts on one port of an open device.
//
// The actions are a table: adding one (`lid N`, `speed S`, ...) is a row
// below plus its function, and a line in kUsage.
#include <fmt/format.h>

#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kPortCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: port DEV PORT ACTION [VALUE]\n"
    "Acts on port PORT (1, 2) of device DEV (emu0, ...), as a cable or the\n"
    "subnet manager would; every context of the device gets the async event.\n"
    "Actions:\n"
    "  down        the port goes DOWN: IBV_EVENT_PORT_ERR; no packet crosses it\n"
    "  up          the port goes ACTIVE: IBV_EVENT_PORT_ACTIVE\n";

struct PortAction {
  std::string_view name;
  int values;  // how many words follow the action
  Reply (*run)(device::Device& dev, int port, std::span<const std::string> values);
};

Reply SetState(device::Device& dev, int port, device::PortState state) {
  device::PortState before = dev.QueryPort(port).state;
  if (Status s = dev.SetPortState(port, state); !s.ok()) return FromStatus("port", s);
  if (before == state) return Ok(fmt::format("{} port {}: already {}\n", dev.name(), port, ToString(state)));
  return Ok(fmt::format("{} port {}: {} (was {})\n", dev.name(), port, ToString(state), ToString(before)));
}

Reply Down(device::Device& dev, int port, std::span<const std::string>) {
  return SetState(dev, port, device::PortState::kDown);
}
Reply Up(device::Device& dev, int port, std::span<const std::string>) {
  return SetState(dev, port, device::PortState::kActive);
}

constexpr PortAction kActions[] = {
    {"down", 0, Down},
    {"up", 0, Up},
};

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
  return UsageError(kPortCommand, fmt::format("unknown action '{}'", args[2]));
}

}  // namespace

const Command kPortCommand = {"port", "take a port down or up", kUsage, PortMain};

}  // namespace rdmaemu::control
