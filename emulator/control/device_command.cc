// `device DEV fatal`: a fatal device error (DEVICE_FATAL), as
// rdmaemu_device_fatal: Device::Fatal runs the engine's handler (every QP to
// ERR, its work flushed), then every context gets the event. One-way: the
// device stays dead until every context of it is closed.
#include <fmt/format.h>

#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kDeviceCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: device DEV fatal\n"
    "A fatal error of device DEV, for good: every QP moves to ERR and its posted\n"
    "work completes with WR_FLUSH_ERR, nothing is sent or received, and every\n"
    "context gets DEVICE_FATAL. Afterwards verbs fail with EIO as on a dead\n"
    "device; destroy, close, poll_cq and get_async_event still work.\n";

Reply DeviceMain(std::span<const std::string> args) {
  if (args.size() < 2) return UsageError(kDeviceCommand, "expected DEV fatal");
  auto dev = FindDevice(args[0]);
  if (!dev.ok()) return FromStatus("device", dev.status());
  if (args[1] != "fatal") return UsageError(kDeviceCommand, fmt::format("unknown action '{}' (actions: fatal)", args[1]));
  if (args.size() > 2) return UsageError(kDeviceCommand, fmt::format("unexpected argument '{}'", args[2]));
  device::Device& d = **dev;
  if (d.dead()) return Ok(fmt::format("{}: already dead after a fatal error\n", d.name()));
  d.Fatal("`rdmaemu device " + d.name() + " fatal`");
  return Ok(fmt::format("{}: fatal error: every QP is in ERR and DEVICE_FATAL was raised\n", d.name()));
}

}  // namespace

const Command kDeviceCommand = {"device", "a fatal device error (DEVICE_FATAL)", kUsage, DeviceMain};

}  // namespace rdmaemu::control
