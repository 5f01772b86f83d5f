// `fault [DEV] add RULES | clear | list`: the fault rules of a running
// process's devices, the third way to set them (docs/faults.md) besides
// RDMAEMU_FAULTS at start and rdmaemu_fault_add from inside the program.
// All three go through the device engine's Injector (Add, Clear, List), so
// the rule language, its checks and its messages are the same everywhere.
//
// Without DEV the action is for every open device, as RDMAEMU_FAULTS is:
// `fault list` shows them all, and a rule meant for one device of several
// says so with `dev=NAME`.
#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/control/command.h"
#include "emulator/engine/engine.h"
#include "emulator/fault/injector.h"
#include "emulator/fault/parse.h"

namespace rdmaemu::control {

extern const Command kFaultCommand;

namespace {

constexpr std::string_view kUsage =
    "Usage: fault [DEV] add RULES\n"
    "       fault [DEV] clear\n"
    "       fault [DEV] list\n"
    "Adds fault rules to device DEV (emu0, ...), removes them all, or lists the\n"
    "active ones with how many packets each matched. Without DEV: every open\n"
    "device. RULES is the RDMAEMU_FAULTS syntax (docs/faults.md), e.g.\n"
    "drop=0.05,seed=7 or drop=#3@op=READ_RESPONSE; several words are joined with\n"
    "spaces. A rule that does not parse, or does not fit a device (a port it\n"
    "lacks, a dev= it is not added to), is refused and nothing changes.\n";

using Words = std::span<const std::string>;

// "DEV: line" for each line of `text`.
std::string Prefixed(const std::string& device, std::string_view text) {
  std::string out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    out += fmt::format("{}: {}\n", device, text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return out;
}

std::string ListOf(const Running& r) {
  const std::string rules = r.engine->faults().List();
  if (rules.empty()) return fmt::format("{}: no fault rules\n", r.device->name());
  return Prefixed(r.device->name(), rules);
}

std::vector<std::string> Names(const std::vector<Running>& targets) {
  std::vector<std::string> names;
  for (const Running& r : targets) names.push_back(r.device->name());
  return names;
}

// A rule naming a device (dev=NAME) must be for one it is added to: on any
// other it would silently match nothing.
Status CheckDeviceFilters(const fault::RuleSet& set, const std::vector<Running>& targets) {
  const std::vector<std::string> names = Names(targets);
  auto check = [&](const std::optional<std::string>& dev, const std::string& rule) -> Status {
    if (!dev || std::find(names.begin(), names.end(), *dev) != names.end()) return Status::Ok();
    return InvalidArgument(fmt::format("\"{}\": dev={}: the rule is added to {} only", rule, *dev,
                                       fmt::join(names, ", ")));
  };
  for (const fault::Rule& r : set.rules) {
    if (Status s = check(r.filter.device, fault::ToString(r)); !s.ok()) return s;
  }
  for (const fault::Shaping& sh : set.shaping) {
    if (Status s = check(sh.device, fault::ToString(sh)); !s.ok()) return s;
  }
  return Status::Ok();
}

Reply Add(const std::vector<Running>& targets, Words words) {
  if (words.empty()) return UsageError(kFaultCommand, "'add' needs RULES (e.g. drop=0.05@op=SEND)");
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  // The parser's message quotes the rule and names the bad token.
  auto set = fault::ParseRules(text);
  if (!set.ok()) return UsageError(kFaultCommand, set.status().message());
  if (set->rules.empty() && set->shaping.empty() && !set->seed) {
    return UsageError(kFaultCommand, fmt::format("no rule in '{}'", text));
  }
  if (Status s = CheckDeviceFilters(*set, targets); !s.ok()) return FromStatus("fault", s);
  // Check-then-apply over several devices: a device's own refusal (a port
  // it lacks) must leave the others unchanged too, so each checks the text
  // on a scratch injector of its shape before any gets it (on the heap: an
  // injector holds 2 MiB of occurrence tables).
  for (const Running& r : targets) {
    auto scratch = std::make_unique<fault::Injector>(r.device->name(),
                                                     std::vector<uint64_t>(r.device->num_ports(), 0));
    if (Status s = scratch->Add(text); !s.ok()) {
      return Failure(fmt::format("fault: {}: {}", r.device->name(), s.message()));
    }
  }
  std::string out;
  for (const Running& r : targets) {
    if (Status s = r.engine->faults().Add(text); !s.ok()) {
      return Failure(fmt::format("{}fault: {}: {}", out, r.device->name(), s.message()));
    }
    Log().info("{}: fault rules now (from the control socket):\n{}", r.device->name(),
               r.engine->faults().List());
    out += ListOf(r);
  }
  return Ok(std::move(out));
}

Reply Clear(const std::vector<Running>& targets, Words words) {
  if (!words.empty()) return UsageError(kFaultCommand, fmt::format("unexpected argument '{}'", words[0]));
  std::string out;
  for (const Running& r : targets) {
    const bool had = !r.engine->faults().List().empty();
    r.engine->faults().Clear();
    if (had) Log().info("{}: fault rules cleared (from the control socket)", r.device->name());
    out += fmt::format("{}: {}\n", r.device->name(), had ? "fault rules cleared" : "no fault rules");
  }
  return Ok(std::move(out));
}

Reply List(const std::vector<Running>& targets, Words words) {
  if (!words.empty()) return UsageError(kFaultCommand, fmt::format("unexpected argument '{}'", words[0]));
  std::string out;
  for (const Running& r : targets) out += ListOf(r);
  return Ok(std::move(out));
}

struct FaultAction {
  std::string_view name;
  Reply (*run)(const std::vector<Running>& targets, Words words);
};

constexpr FaultAction kActions[] = {{"add", Add}, {"clear", Clear}, {"list", List}};

const FaultAction* FindAction(std::string_view name) {
  for (const FaultAction& a : kActions) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

Reply FaultMain(Words args) {
  if (args.empty()) return UsageError(kFaultCommand, "expected [DEV] add RULES, [DEV] clear or [DEV] list");
  // The first word is an action (every device) or a device name.
  const FaultAction* action = FindAction(args[0]);
  std::vector<Running> targets;
  if (action != nullptr) {
    auto all = RunningDevices();
    if (!all.ok()) return FromStatus("fault", all.status());
    targets = std::move(all).value();
    args = args.subspan(1);
  } else {
    auto dev = FindDevice(args[0]);
    if (!dev.ok()) {
      // `fault emu9 list` names a device that is not there; `fault lsit`
      // misspells an action.
      if (args.size() >= 2 && FindAction(args[1]) != nullptr) return FromStatus("fault", dev.status());
      return UsageError(kFaultCommand,
                        fmt::format("unknown action '{}' (actions: add, clear, list, after an optional DEV)", args[0]));
    }
    if (args.size() < 2) {
      return UsageError(kFaultCommand, fmt::format("expected an action after {} (add, clear, list)", args[0]));
    }
    action = FindAction(args[1]);
    if (action == nullptr) {
      return UsageError(kFaultCommand, fmt::format("unknown action '{}' (actions: add, clear, list)", args[1]));
    }
    auto engine = FindEngine(**dev);
    if (!engine.ok()) return FromStatus("fault", engine.status());
    targets.push_back({*dev, *engine});
    args = args.subspan(2);
  }
  return action->run(targets, args);
}

}  // namespace

const Command kFaultCommand = {"fault", "add, clear or list fault rules (drop, delay, corrupt, ...)", kUsage,
                               FaultMain};

}  // namespace rdmaemu::control
