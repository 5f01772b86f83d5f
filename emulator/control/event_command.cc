// `event TYPE TARGET`: raises any async event on a QP, CQ, SRQ, WQ, port or
// device, delivered exactly as one from a real cause, for testing handlers.
// The event changes nothing else: `event port_err` leaves the port ACTIVE
// (`port DEV PORT down` is the real thing).
#include <algorithm>
#include <cctype>
#include <optional>

#include <fmt/format.h>

#include "emulator/control/command.h"

namespace rdmaemu::control {

extern const Command kEventCommand;

namespace {

using device::AsyncEventType;
using objects::ObjectKind;

enum class Target { kQp, kCq, kSrq, kWq, kPort, kDevice };

struct EventKind {
  AsyncEventType type;
  std::string_view name;  // libibverbs' name without IBV_EVENT_
  Target target;
};

// Every async event of ibv_get_async_event(3) and what it names.
constexpr EventKind kEvents[] = {
    {AsyncEventType::kCqErr, "CQ_ERR", Target::kCq},
    {AsyncEventType::kQpFatal, "QP_FATAL", Target::kQp},
    {AsyncEventType::kQpReqErr, "QP_REQ_ERR", Target::kQp},
    {AsyncEventType::kQpAccessErr, "QP_ACCESS_ERR", Target::kQp},
    {AsyncEventType::kCommEst, "COMM_EST", Target::kQp},
    {AsyncEventType::kSqDrained, "SQ_DRAINED", Target::kQp},
    {AsyncEventType::kPathMig, "PATH_MIG", Target::kQp},
    {AsyncEventType::kPathMigErr, "PATH_MIG_ERR", Target::kQp},
    {AsyncEventType::kDeviceFatal, "DEVICE_FATAL", Target::kDevice},
    {AsyncEventType::kPortActive, "PORT_ACTIVE", Target::kPort},
    {AsyncEventType::kPortErr, "PORT_ERR", Target::kPort},
    {AsyncEventType::kLidChange, "LID_CHANGE", Target::kPort},
    {AsyncEventType::kPkeyChange, "PKEY_CHANGE", Target::kPort},
    {AsyncEventType::kSmChange, "SM_CHANGE", Target::kPort},
    {AsyncEventType::kSrqErr, "SRQ_ERR", Target::kSrq},
    {AsyncEventType::kSrqLimitReached, "SRQ_LIMIT_REACHED", Target::kSrq},
    {AsyncEventType::kQpLastWqeReached, "QP_LAST_WQE_REACHED", Target::kQp},
    {AsyncEventType::kClientReregister, "CLIENT_REREGISTER", Target::kPort},
    {AsyncEventType::kGidChange, "GID_CHANGE", Target::kPort},
    {AsyncEventType::kWqFatal, "WQ_FATAL", Target::kWq},
    {AsyncEventType::kDeviceSpeedChange, "DEVICE_SPEED_CHANGE", Target::kPort},
};

constexpr std::string_view kUsage =
    "Usage: event TYPE TARGET\n"
    "Raises async event TYPE, delivered as one from a real cause (to the context\n"
    "owning the object, or to every context of the device for port and device\n"
    "events). Nothing else changes: `event port_err` leaves the port ACTIVE.\n"
    "TYPE: as in ibv_event_type, any case, with or without IBV_EVENT_\n"
    "(qp_fatal, QP_FATAL, IBV_EVENT_QP_FATAL). TARGET by the kind of event:\n"
    "  --qp QPN         QP_FATAL QP_REQ_ERR QP_ACCESS_ERR COMM_EST SQ_DRAINED\n"
    "                   PATH_MIG PATH_MIG_ERR QP_LAST_WQE_REACHED\n"
    "  --cq N           CQ_ERR\n"
    "  --srq N          SRQ_ERR SRQ_LIMIT_REACHED\n"
    "  --wq WQN         WQ_FATAL\n"
    "  --port DEV PORT  PORT_ACTIVE PORT_ERR LID_CHANGE PKEY_CHANGE SM_CHANGE\n"
    "                   CLIENT_REREGISTER GID_CHANGE DEVICE_SPEED_CHANGE\n"
    "  --device DEV     DEVICE_FATAL; with --qp/--cq/--srq/--wq: the device\n"
    "                   whose object is meant (needed when two have that number)\n"
    "QPNs, WQNs and numbers are decimal or 0x-hex; `list` shows them.\n";

std::string Normalize(std::string_view word) {
  std::string s;
  for (char c : word) s.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  if (s.starts_with("IBV_EVENT_")) s.erase(0, 10);
  return s;
}

const EventKind* FindEvent(std::string_view word) {
  std::string n = Normalize(word);
  for (const EventKind& e : kEvents) {
    if (e.name == n) return &e;
  }
  return nullptr;
}

std::string_view TargetOption(Target t) {
  switch (t) {
    case Target::kQp: return "--qp QPN";
    case Target::kCq: return "--cq N";
    case Target::kSrq: return "--srq N";
    case Target::kWq: return "--wq WQN";
    case Target::kPort: return "--port DEV PORT";
    case Target::kDevice: return "--device DEV";
  }
  return "";
}

std::string_view TargetNoun(Target t) {
  switch (t) {
    case Target::kQp: return "a QP";
    case Target::kCq: return "a CQ";
    case Target::kSrq: return "an SRQ";
    case Target::kWq: return "a WQ";
    case Target::kPort: return "a port";
    case Target::kDevice: return "a device";
  }
  return "";
}

ObjectKind KindOf(Target t) {
  switch (t) {
    case Target::kCq: return ObjectKind::kCq;
    case Target::kSrq: return ObjectKind::kSrq;
    case Target::kWq: return ObjectKind::kWq;
    default: return ObjectKind::kQp;
  }
}

// The parsed words after TYPE.
struct Parsed {
  std::optional<Target> target;  // qp, cq, srq, wq or port
  std::string object;            // the number's word
  std::string port_device, port;
  std::optional<std::string> device;
};

Result<Parsed> ParseTarget(std::span<const std::string> args) {
  Parsed p;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string opt = args[i];
    std::optional<std::string> inline_value;
    if (auto eq = opt.find('='); opt.starts_with("--") && eq != std::string::npos) {
      inline_value = opt.substr(eq + 1);
      opt.resize(eq);
    }
    auto value = [&](std::string_view what) -> Result<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return InvalidArgument(fmt::format("'{}' needs {}", opt, what));
      return args[++i];
    };
    std::optional<Target> t;
    if (opt == "--qp") t = Target::kQp;
    else if (opt == "--cq") t = Target::kCq;
    else if (opt == "--srq") t = Target::kSrq;
    else if (opt == "--wq") t = Target::kWq;
    else if (opt == "--port") t = Target::kPort;
    if (t) {
      if (p.target) return InvalidArgument("give one target (--qp, --cq, --srq, --wq or --port)");
      p.target = t;
      if (*t == Target::kPort) {
        if (inline_value || i + 2 >= args.size()) return InvalidArgument("'--port' needs DEV PORT");
        p.port_device = args[++i];
        p.port = args[++i];
      } else {
        auto v = value("a number");
        if (!v.ok()) return v.status();
        p.object = *v;
      }
    } else if (opt == "--device") {
      if (p.device) return InvalidArgument("'--device' given twice");
      auto v = value("a device name");
      if (!v.ok()) return v.status();
      p.device = *v;
    } else {
      return InvalidArgument(fmt::format("unexpected argument '{}'", args[i]));
    }
  }
  if (!p.target && !p.device) return InvalidArgument("no target (--qp, --cq, --srq, --wq, --port or --device)");
  if (p.target == Target::kPort && p.device) {
    return InvalidArgument("--port names its device already; drop --device");
  }
  return p;
}

Reply RaiseOnObject(const EventKind& e, const Parsed& p) {
  auto number = ParseNumber(p.object, 0xffffff);
  if (!number.ok()) return UsageError(kEventCommand, fmt::format("{}: {}", TargetOption(e.target), number.status().message()));
  const ObjectKind kind = KindOf(e.target);
  const auto n = static_cast<uint32_t>(*number);
  std::vector<std::shared_ptr<device::Device>> devices;
  if (p.device) {
    auto dev = FindDevice(*p.device);
    if (!dev.ok()) return FromStatus("event", dev.status());
    devices.push_back(*dev);
  } else {
    devices = device::Registry::Get().OpenDevices();
  }
  std::vector<std::shared_ptr<device::Device>> holders;
  for (auto& d : devices) {
    if (d->directory().With(kind, n, [](uint64_t) {}).ok()) holders.push_back(d);
  }
  if (holders.empty()) {
    return Failure(fmt::format("event: no {} {} {}in this process (see `list`)", objects::ToString(kind), n,
                               p.device ? fmt::format("on {} ", *p.device) : ""));
  }
  if (holders.size() > 1) {
    return Failure(fmt::format("event: {} {} exists on {} and {}; add --device DEV to choose",
                               objects::ToString(kind), n, holders[0]->name(), holders[1]->name()));
  }
  device::Device& dev = *holders[0];
  // Raised while the directory holds the object: a destroy running now
  // waits, so the event never names freed memory (and its queued copy is
  // discarded by that destroy like any other).
  Status s = dev.directory().With(kind, n, [&](uint64_t handle) { dev.Raise({e.type, handle, 0}); });
  if (!s.ok()) return Failure(fmt::format("event: {} {} was destroyed meanwhile", objects::ToString(kind), n));
  return Ok(fmt::format("{} {} {}: raised IBV_EVENT_{}\n", dev.name(), objects::ToString(kind), n, e.name));
}

Reply EventMain(std::span<const std::string> args) {
  if (args.empty()) return UsageError(kEventCommand, "expected TYPE TARGET");
  const EventKind* e = FindEvent(args[0]);
  if (e == nullptr) return UsageError(kEventCommand, fmt::format("'{}' is not an async event type", args[0]));
  auto parsed = ParseTarget(args.subspan(1));
  if (!parsed.ok()) return UsageError(kEventCommand, parsed.status().message());
  const Parsed& p = *parsed;
  const Target given = p.target.value_or(Target::kDevice);
  if (given != e->target) {
    return UsageError(kEventCommand, fmt::format("{} is an event of {}: give {}, not {}", e->name,
                                                 TargetNoun(e->target), TargetOption(e->target),
                                                 TargetOption(given)));
  }
  switch (e->target) {
    case Target::kPort: {
      auto dev = FindDevice(p.port_device);
      if (!dev.ok()) return FromStatus("event", dev.status());
      auto port = ParsePort(**dev, p.port);
      if (!port.ok()) return FromStatus("event", port.status());
      (*dev)->Raise({e->type, 0, static_cast<uint8_t>(*port)});
      return Ok(fmt::format("{} port {}: raised IBV_EVENT_{}\n", (*dev)->name(), *port, e->name));
    }
    case Target::kDevice: {
      auto dev = FindDevice(*p.device);
      if (!dev.ok()) return FromStatus("event", dev.status());
      (*dev)->Raise({e->type, 0, 0});
      return Ok(fmt::format("{}: raised IBV_EVENT_{}\n", (*dev)->name(), e->name));
    }
    default:
      return RaiseOnObject(*e, p);
  }
}

}  // namespace

const Command kEventCommand = {"event", "raise any async event on a QP, CQ, SRQ, WQ, port or device",
                               kUsage, EventMain};

}  // namespace rdmaemu::control
