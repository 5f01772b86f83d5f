// `list`: what this process has open, so a user can find what to target:
// its devices with their ports, and their QPs, CQs, SRQs and WQs by number.
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kListCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: list\n"
    "Lists what this process has open, one line each:\n"
    "  process PID NAME\n"
    "  DEV port N STATE\n"
    "  DEV qp QPN (0xQPN) TYPE STATE   (the QPN in decimal, then in hex as programs print it)\n"
    "  DEV wq WQN (0xWQN) STATE        (a WQ by its wq_num, like a QP)\n"
    "  DEV cq N | DEV srq N\n"
    "The numbers are what `event ... --qp/--cq/--srq/--wq` take.\n";

Reply ListMain(std::span<const std::string> args) {
  if (!args.empty()) return UsageError(kListCommand, fmt::format("unexpected argument '{}'", args[0]));
  std::string out = fmt::format("process {} {}\n", ::getpid(), ProgramName());
  for (const auto& dev : device::Registry::Get().OpenDevices()) {
    for (int port = 1; port <= dev->num_ports(); ++port) {
      out += fmt::format("{} port {} {}\n", dev->name(), port, ToString(dev->QueryPort(port).state));
    }
    for (const auto& o : dev->directory().List()) {
      std::string line = fmt::format("{} {} {}", dev->name(), objects::ToString(o.kind), o.number);
      if (o.kind == objects::ObjectKind::kQp || o.kind == objects::ObjectKind::kWq) {
        line += fmt::format(" (0x{:06x})", o.number);
      }
      if (!o.details.empty()) line += " " + o.details;
      out += line + "\n";
    }
  }
  return Ok(std::move(out));
}

}  // namespace

const Command kListCommand = {"list", "list the devices, ports, QPs, CQs, SRQs and WQs of each process",
                              kUsage, ListMain};

}  // namespace rdmaemu::control
