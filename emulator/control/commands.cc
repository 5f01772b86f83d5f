// The command table and what every handler shares.
#include <algorithm>
#include <charconv>
#include <fstream>

#include <fmt/format.h>

#include "emulator/control/command.h"
#include "emulator/engine/engine.h"

namespace rdmaemu::control {

// Each is defined in its own <name>_command.cc.
extern const Command kCaptureCommand;
extern const Command kTraceCommand;
extern const Command kDeviceCommand;
extern const Command kEventCommand;
extern const Command kFaultCommand;
extern const Command kGidCommand;
extern const Command kListCommand;
extern const Command kPortCommand;
extern const Command kStatsCommand;

namespace {

// One line per command, in the order `help` lists them.
const Command* const kTable[] = {
    &kListCommand,
    &kPortCommand,
    &kEventCommand,
    &kGidCommand,
    &kDeviceCommand,
    &kFaultCommand,
    &kStatsCommand,
    &kCaptureCommand,
    &kTraceCommand,
};

const Command* Find(std::string_view name) {
  for (const Command* c : kTable) {
    if (c->name == name) return c;
  }
  return nullptr;
}

std::string Help() {
  std::string out = "Commands:\n";
  for (const Command* c : kTable) out += fmt::format("  {:<10} {}\n", c->name, c->summary);
  return out;
}

}  // namespace

std::span<const Command* const> Commands() { return kTable; }

Reply Dispatch(std::span<const std::string> words) {
  if (words.empty()) return {kStatusUsage, "", "no command\n"};
  if (words[0] == "help") {
    if (words.size() == 1) return Ok(Help());
    const Command* c = Find(words[1]);
    if (c == nullptr) return {kStatusUsage, "", fmt::format("help: unknown command '{}'\n", words[1])};
    return Ok(std::string(c->usage));
  }
  const Command* c = Find(words[0]);
  if (c == nullptr) {
    std::vector<std::string_view> names;
    for (const Command* k : kTable) names.push_back(k->name);
    return {kStatusUsage, "",
            fmt::format("{}: unknown command (this process has: {})\n", words[0], fmt::join(names, ", "))};
  }
  return c->handler(words.subspan(1));
}

Reply Ok(std::string out) { return {kStatusOk, std::move(out), ""}; }

Reply Failure(std::string err) {
  if (!err.empty() && err.back() != '\n') err.push_back('\n');
  return {kStatusFailure, "", std::move(err)};
}

Reply UsageError(const Command& command, std::string_view message) {
  return {kStatusUsage, "", fmt::format("{}: {}\n", command.name, message)};
}

Reply FromStatus(std::string_view command, const Status& status) {
  return Failure(fmt::format("{}: {}", command, status.message()));
}

Result<std::shared_ptr<device::Device>> FindDevice(std::string_view name) {
  auto devices = device::Registry::Get().OpenDevices();
  std::vector<std::string> names;
  for (auto& d : devices) {
    if (d->name() == name) return d;
    names.push_back(d->name());
  }
  if (names.empty()) return NotFound(fmt::format("no device is open in this process, so not {}", name));
  return NotFound(fmt::format("{} is not open in this process (open: {})", name, fmt::join(names, ", ")));
}

Result<std::shared_ptr<engine::Engine>> FindEngine(const device::Device& dev) {
  auto e = engine::FindEngine(dev.index());
  if (!e) return NotFound(fmt::format("{} has no engine running in this process", dev.name()));
  return e;
}

Result<std::vector<Running>> RunningDevices() {
  std::vector<Running> out;
  for (auto& d : device::Registry::Get().OpenDevices()) {
    if (auto e = engine::FindEngine(d->index())) out.push_back({d, std::move(e)});
  }
  if (out.empty()) return NotFound("no device is open in this process");
  return out;
}

std::string ProgramName() {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  return name.empty() ? "?" : name;
}

Result<uint64_t> ParseNumber(std::string_view word, uint64_t max) {
  int base = 10;
  std::string_view digits = word;
  if (digits.starts_with("0x") || digits.starts_with("0X")) {
    base = 16;
    digits.remove_prefix(2);
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    return InvalidArgument(fmt::format("'{}' is not a number", word));
  }
  if (v > max) return InvalidArgument(fmt::format("{} is larger than {}", word, max));
  return v;
}

Result<int> ParsePort(const device::Device& dev, std::string_view word) {
  auto n = ParseNumber(word, 255);
  if (!n.ok() || !dev.ValidPort(static_cast<int>(*n))) {
    return InvalidArgument(fmt::format("{} has no port '{}' (ports are 1..{})", dev.name(), word,
                                       dev.num_ports()));
  }
  return static_cast<int>(*n);
}

std::string_view ToString(device::PortState state) {
  switch (state) {
    case device::PortState::kDown: return "DOWN";
    case device::PortState::kInit: return "INIT";
    case device::PortState::kArmed: return "ARMED";
    case device::PortState::kActive: return "ACTIVE";
  }
  return "UNKNOWN";
}

}  // namespace rdmaemu::control
