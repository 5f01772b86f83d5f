// `stats [DEV [PORT]] [--qp QPN] [--json]`: the engine's counters of a
// running process, as rdmaemu_query_counters and rdmaemu_query_qp_counters
// give them to the program (Engine::counters, port_counters, qp_counters),
// what fault rules did (fault_*) among them.
//
// Every counter of RDMAEMU_COUNTERS is printed through ForEachCounter, so a
// counter added to that list appears here by itself.
#include <unistd.h>

#include <optional>

#include <fmt/format.h>

#include "emulator/control/command.h"
#include "emulator/engine/counters.h"
#include "emulator/engine/engine.h"

namespace rdmaemu::control {

extern const Command kStatsCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: stats [DEV [PORT]] [--qp QPN] [--json]\n"
    "Prints the counters of each open device (the sum of its ports), of port\n"
    "PORT of device DEV, or of one QP (fault_* count what fault rules did): `name value`\n"
    "per line under a header line naming the process, device, port or QP.\n"
    "  --qp QPN   one QP's counters (decimal or 0x-hex; `list` shows the QPNs);\n"
    "             DEV picks the device when two have that QPN\n"
    "  --json     one JSON object instead: {\"pid\", \"program\", \"stats\": [{\"device\",\n"
    "             [\"port\" | \"qp\"], \"counters\": {...}}]}\n";

// One block of the output: a device, one of its ports, or one QP.
struct Block {
  std::string device;
  std::optional<int> port;
  std::optional<uint32_t> qp;
  engine::CounterValues counters;
};

struct Request {
  std::optional<std::string> device;
  std::optional<std::string> port;
  std::optional<std::string> qp;
  bool json = false;
};

Result<Request> Parse(std::span<const std::string> args) {
  Request r;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--json") {
      r.json = true;
    } else if (a == "--qp") {
      if (i + 1 >= args.size()) return InvalidArgument("'--qp' needs a QPN");
      r.qp = args[++i];
    } else if (a.starts_with("--qp=")) {
      r.qp = a.substr(5);
    } else if (a.starts_with("-")) {
      return InvalidArgument(fmt::format("unknown option '{}' (options: --qp QPN, --json)", a));
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() > 2) return InvalidArgument(fmt::format("unexpected argument '{}'", positional[2]));
  if (!positional.empty()) r.device = positional[0];
  if (positional.size() == 2) r.port = positional[1];
  if (r.qp && r.port) return InvalidArgument("give a PORT or --qp QPN, not both");
  return r;
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Text(const std::vector<Block>& blocks) {
  std::string out;
  for (const Block& b : blocks) {
    if (!out.empty()) out += "\n";
    out += fmt::format("process {} {} device {}", ::getpid(), ProgramName(), b.device);
    if (b.port) out += fmt::format(" port {}", *b.port);
    if (b.qp) out += fmt::format(" qp {} (0x{:06x})", *b.qp, *b.qp);
    out += "\n";
    engine::ForEachCounter(b.counters, [&](std::string_view name, std::string_view, uint64_t v) {
      out += fmt::format("{} {}\n", name, v);
    });
  }
  return out;
}

std::string Json(const std::vector<Block>& blocks) {
  std::vector<std::string> items;
  for (const Block& b : blocks) {
    std::string item = fmt::format("    {{\"device\": {}", JsonString(b.device));
    if (b.port) item += fmt::format(", \"port\": {}", *b.port);
    if (b.qp) item += fmt::format(", \"qp\": {}", *b.qp);
    std::vector<std::string> fields;
    engine::ForEachCounter(b.counters, [&](std::string_view name, std::string_view, uint64_t v) {
      fields.push_back(fmt::format("\"{}\": {}", name, v));
    });
    item += fmt::format(",\n     \"counters\": {{{}}}", fmt::join(fields, ", "));
    items.push_back(item + "}");
  }
  return fmt::format("{{\"pid\": {}, \"program\": {}, \"stats\": [\n{}\n]}}\n", ::getpid(),
                     JsonString(ProgramName()), fmt::join(items, ",\n"));
}

Block DeviceBlock(const Running& r) {
  return {r.device->name(), std::nullopt, std::nullopt, r.engine->counters()};
}

// The QP `word` names, on `targets` (all devices, or the one given).
Result<Block> QpBlock(const std::vector<Running>& targets, std::string_view word, bool device_given) {
  auto qpn = ParseNumber(word, 0xffffff);
  if (!qpn.ok()) return InvalidArgument(fmt::format("--qp QPN: {}", qpn.status().message()));
  std::vector<Block> found;
  for (const Running& r : targets) {
    auto c = r.engine->qp_counters(static_cast<uint32_t>(*qpn));
    if (c.ok()) found.push_back({r.device->name(), std::nullopt, static_cast<uint32_t>(*qpn), *c});
  }
  if (found.empty()) {
    if (device_given) return NotFound(fmt::format("{} has no qp {} (see `list`)", targets[0].device->name(), word));
    return NotFound(fmt::format("no qp {} in this process (see `list`)", word));
  }
  if (found.size() > 1) {
    return NotFound(fmt::format("qp {} is on {} and {}: give DEV", word, found[0].device, found[1].device));
  }
  return found[0];
}

Reply StatsMain(std::span<const std::string> args) {
  auto req = Parse(args);
  if (!req.ok()) return UsageError(kStatsCommand, req.status().message());
  std::vector<Running> targets;
  if (req->device) {
    auto dev = FindDevice(*req->device);
    if (!dev.ok()) return FromStatus("stats", dev.status());
    auto engine = FindEngine(**dev);
    if (!engine.ok()) return FromStatus("stats", engine.status());
    targets.push_back({*dev, *engine});
  } else {
    auto all = RunningDevices();
    if (!all.ok()) return FromStatus("stats", all.status());
    targets = std::move(all).value();
  }

  std::vector<Block> blocks;
  if (req->qp) {
    auto b = QpBlock(targets, *req->qp, req->device.has_value());
    if (!b.ok()) {
      if (b.status().code() == EINVAL) return UsageError(kStatsCommand, b.status().message());
      return FromStatus("stats", b.status());
    }
    blocks.push_back(std::move(b).value());
  } else if (req->port) {
    const Running& r = targets[0];
    auto port = ParsePort(*r.device, *req->port);
    if (!port.ok()) return FromStatus("stats", port.status());
    auto c = r.engine->port_counters(*port);
    if (!c.ok()) return FromStatus("stats", c.status());
    blocks.push_back({r.device->name(), *port, std::nullopt, *c});
  } else {
    for (const Running& r : targets) blocks.push_back(DeviceBlock(r));
  }
  return Ok(req->json ? Json(blocks) : Text(blocks));
}

}  // namespace

const Command kStatsCommand = {"stats", "counters of each device, port or QP, and what fault rules did", kUsage,
                               StatsMain};

}  // namespace rdmaemu::control
