#include "emulator/fault/parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "emulator/wire/opcode.h"

namespace rdmaemu::fault {
namespace {

// ---------------------------------------------------------------------------
// Small lexical helpers.

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// Splits on any of `seps`, trimming each piece; keeps empty pieces.
std::vector<std::string_view> Split(std::string_view s, std::string_view seps) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || seps.find(s[i]) != std::string_view::npos) {
      out.push_back(Trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

std::optional<double> ParseDouble(std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<uint64_t> ParseU64(std::string_view s) {
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    s.remove_prefix(2);
    base = 16;
  }
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, base);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Splits "123.5us" into number and unit.
std::pair<std::string_view, std::string_view> NumberAndUnit(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  return {s.substr(0, i), s.substr(i)};
}

// ---------------------------------------------------------------------------
// Value parsers. Each error names the key and the value as written.

struct Unit {
  std::string_view name;
  double scale;
};

constexpr Unit kTimeUnits[] = {{"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
constexpr Unit kRateUnits[] = {
    {"bps", 1}, {"kbps", 1e3}, {"mbps", 1e6}, {"gbps", 1e9}, {"tbps", 1e12}};
constexpr Duration kMaxDuration = std::chrono::seconds(60);

Result<Duration> ParseDuration(std::string_view key, std::string_view s) {
  auto [num, unit] = NumberAndUnit(s);
  auto v = ParseDouble(num);
  const std::string u = Lower(unit);
  for (const Unit& t : kTimeUnits) {
    if (v && u == t.name) {
      const double ns = std::round(*v * t.scale);
      if (ns > static_cast<double>(kMaxDuration.count())) break;
      return Duration(static_cast<int64_t>(ns));
    }
  }
  return InvalidArgument(fmt::format(
      "{}: \"{}\" is not a duration from 0 to 60s with a unit (ns, us, ms, s), e.g. 200us", key, s));
}

Result<Trigger> ParseTrigger(std::string_view key, std::string_view s) {
  const std::string help = fmt::format(
      "{}: \"{}\" is not a trigger: give a probability (0.05 or 5%) or which matching packets "
      "(#3, #3..5, #3..)",
      key, s);
  Trigger t;
  if (!s.empty() && s[0] == '#') {
    std::string_view rest = s.substr(1);
    const size_t dots = rest.find("..");
    auto first = ParseU64(rest.substr(0, dots));
    if (!first || *first == 0) return InvalidArgument(help + " (counts start at #1)");
    t.kind = Trigger::Kind::kCount;
    t.first = *first;
    t.last = *first;
    if (dots != std::string_view::npos) {
      std::string_view tail = rest.substr(dots + 2);
      if (tail.empty()) {
        t.last = std::numeric_limits<uint64_t>::max();
      } else {
        auto last = ParseU64(tail);
        if (!last || *last < *first) return InvalidArgument(help + " (the range must not run backwards)");
        t.last = *last;
      }
    }
    return t;
  }
  std::optional<double> p;
  if (!s.empty() && s.back() == '%') {
    if (auto pct = ParseDouble(s.substr(0, s.size() - 1))) p = *pct / 100.0;
  } else {
    p = ParseDouble(s);
  }
  if (!p || *p < 0.0 || *p > 1.0) return InvalidArgument(help);
  t.kind = Trigger::Kind::kProbability;
  t.probability = *p;
  return t;
}

// ---------------------------------------------------------------------------
// The effect keys, as a table.

// What one rule is being built into.
struct Item {
  Rule rule;
  Shaping shaping;
  bool packet = false;   // has packet effects
  bool forced = false;   // has forced protocol events
  bool shaped = false;   // has shaping keys
  std::optional<uint64_t> seed;
  std::vector<std::string> keys_seen;  // effects and filters, to refuse repeats
  bool dir_given = false;
};

using EffectParser = Status (*)(std::string_view key, std::optional<std::string_view> value, Item&);

// drop, dup, corrupt, reorder: [=TRIGGER].
Status PacketEffect(Action action, std::string_view key, std::optional<std::string_view> value,
                    Item& item) {
  Effect e;
  e.action = action;
  if (value) {
    auto t = ParseTrigger(key, *value);
    if (!t.ok()) return t.status();
    e.trigger = *t;
  }
  item.rule.effects.push_back(e);
  item.packet = true;
  return Status::Ok();
}

// Splits "VALUE/TRIGGER" and parses the trigger part into `e`.
Result<std::string_view> WithTrigger(std::string_view key, std::string_view value, Effect& e) {
  const size_t slash = value.find('/');
  if (slash == std::string_view::npos) return value;
  auto t = ParseTrigger(key, Trim(value.substr(slash + 1)));
  if (!t.ok()) return t.status();
  e.trigger = *t;
  return Trim(value.substr(0, slash));
}

Status Delay(std::string_view key, std::optional<std::string_view> value, Item& item) {
  if (!value || value->empty()) {
    return InvalidArgument("delay needs a duration, e.g. delay=200us or delay=100us~50us");
  }
  Effect e;
  e.action = Action::kDelay;
  auto v = WithTrigger(key, *value, e);
  if (!v.ok()) return v.status();
  const size_t tilde = v->find('~');
  auto d = ParseDuration(key, Trim(v->substr(0, tilde)));
  if (!d.ok()) return d.status();
  e.delay = *d;
  if (tilde != std::string_view::npos) {
    auto j = ParseDuration(key, Trim(v->substr(tilde + 1)));
    if (!j.ok()) return j.status();
    if (*j > *d) {
      return InvalidArgument(fmt::format("delay: the jitter \"{}\" is larger than the delay \"{}\"",
                                         Trim(v->substr(tilde + 1)), Trim(v->substr(0, tilde))));
    }
    e.jitter = *j;
  }
  item.rule.effects.push_back(e);
  item.packet = true;
  return Status::Ok();
}

struct NakName {
  std::string_view name;
  wire::NakCode code;
};
constexpr NakName kNakNames[] = {
    {"seq", wire::NakCode::kPsnSequenceError},
    {"invalid", wire::NakCode::kInvalidRequest},
    {"access", wire::NakCode::kRemoteAccessError},
    {"operational", wire::NakCode::kRemoteOperationalError},
};

Status Nak(std::string_view key, std::optional<std::string_view> value, Item& item) {
  const std::string known = "seq, invalid, access, operational";
  if (!value || value->empty()) {
    return InvalidArgument(fmt::format("nak needs a kind ({}), e.g. nak=access", known));
  }
  Effect e;
  e.action = Action::kNak;
  auto v = WithTrigger(key, *value, e);
  if (!v.ok()) return v.status();
  const std::string kind = Lower(*v);
  auto it = std::find_if(std::begin(kNakNames), std::end(kNakNames),
                         [&](const NakName& n) { return n.name == kind; });
  if (it == std::end(kNakNames)) {
    return InvalidArgument(fmt::format("nak: unknown kind \"{}\" (known: {})", *v, known));
  }
  e.nak = it->code;
  item.rule.effects.push_back(e);
  item.forced = true;
  return Status::Ok();
}

Status ForcedEffect(Action action, std::string_view key, std::optional<std::string_view> value,
                    Item& item) {
  Effect e;
  e.action = action;
  if (value) {
    auto t = ParseTrigger(key, *value);
    if (!t.ok()) return t.status();
    e.trigger = *t;
  }
  item.rule.effects.push_back(e);
  item.forced = true;
  return Status::Ok();
}

Status Rate(std::string_view key, std::optional<std::string_view> value, Item& item) {
  const std::string help =
      "rate: \"{}\" is not a rate: give auto (the port's speed x width), off, or a number with a "
      "unit (bps, kbps, mbps, gbps, tbps), e.g. rate=10gbps";
  if (!value) return InvalidArgument(fmt::format(fmt::runtime(help), ""));
  const std::string v = Lower(*value);
  item.shaping.rate_set = true;
  item.shaped = true;
  if (v == "auto") {
    item.shaping.rate_auto = true;
    return Status::Ok();
  }
  if (v == "off") return Status::Ok();
  auto [num, unit] = NumberAndUnit(v);
  auto n = ParseDouble(num);
  for (const Unit& u : kRateUnits) {
    if (n && unit == u.name && *n * u.scale >= 1.0 && *n * u.scale <= 1e15) {
      item.shaping.rate_bps = static_cast<uint64_t>(std::round(*n * u.scale));
      return Status::Ok();
    }
  }
  return InvalidArgument(fmt::format(fmt::runtime(help), *value));
}

Status Latency(std::string_view key, std::optional<std::string_view> value, Item& item) {
  auto d = ParseDuration(key, value.value_or(""));
  if (!d.ok()) return d.status();
  item.shaping.latency_set = true;
  item.shaping.latency = *d;
  item.shaped = true;
  return Status::Ok();
}

Status Seed(std::string_view key, std::optional<std::string_view> value, Item& item) {
  auto v = ParseU64(value.value_or(""));
  if (!v) {
    return InvalidArgument(fmt::format("seed: \"{}\" is not a number (decimal or 0x hex)",
                                       value.value_or("")));
  }
  item.seed = *v;
  return Status::Ok();
}

struct EffectKey {
  std::string_view name;
  EffectParser parse;
};

constexpr EffectKey kEffectKeys[] = {
    {"drop", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return PacketEffect(Action::kDrop, k, v, i); }},
    {"dup", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return PacketEffect(Action::kDup, k, v, i); }},
    {"corrupt", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return PacketEffect(Action::kCorrupt, k, v, i); }},
    {"reorder", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return PacketEffect(Action::kReorder, k, v, i); }},
    {"delay", Delay},
    {"rnr", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return ForcedEffect(Action::kRnr, k, v, i); }},
    {"nak", Nak},
    {"error", [](std::string_view k, std::optional<std::string_view> v, Item& i) { return ForcedEffect(Action::kError, k, v, i); }},
    {"rate", Rate},
    {"latency", Latency},
    {"seed", Seed},
};

// ---------------------------------------------------------------------------
// The filter keys, as a table.

using FilterParser = Status (*)(std::string_view value, Item&);

Status Dir(std::string_view value, Item& item) {
  const std::string v = Lower(value);
  if (v == "tx") {
    item.rule.filter.dir = kTx;
  } else if (v == "rx") {
    item.rule.filter.dir = kRx;
  } else if (v == "both") {
    item.rule.filter.dir = kBoth;
  } else {
    return InvalidArgument(fmt::format("dir: \"{}\" is not tx, rx or both", value));
  }
  item.dir_given = true;
  return Status::Ok();
}

Status Dev(std::string_view value, Item& item) {
  const bool ok = !value.empty() && value.size() <= 63 &&
                  std::all_of(value.begin(), value.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                  });
  if (!ok) return InvalidArgument(fmt::format("dev: \"{}\" is not a device name", value));
  item.rule.filter.device = std::string(value);
  item.shaping.device = std::string(value);
  return Status::Ok();
}

Status Port(std::string_view value, Item& item) {
  auto v = ParseU64(value);
  if (!v || *v < 1 || *v > 2) {
    return InvalidArgument(fmt::format("port: \"{}\" is not a port number (1 or 2)", value));
  }
  item.rule.filter.port = static_cast<uint8_t>(*v);
  item.shaping.port = static_cast<uint8_t>(*v);
  return Status::Ok();
}

Result<uint32_t> Qpn(std::string_view key, std::string_view value) {
  auto v = ParseU64(value);
  if (!v || *v > wire::k24BitMask) {
    return InvalidArgument(fmt::format(
        "{}: \"{}\" is not a QP number (decimal or 0x hex, below 2^24)", key, value));
  }
  return static_cast<uint32_t>(*v);
}

Status QpnFilter(std::string_view value, Item& item) {
  auto q = Qpn("qpn", value);
  if (!q.ok()) return q.status();
  item.rule.filter.qpn = *q;
  return Status::Ok();
}

Status DstQpnFilter(std::string_view value, Item& item) {
  auto q = Qpn("dst_qpn", value);
  if (!q.ok()) return q.status();
  item.rule.filter.dst_qpn = *q;
  return Status::Ok();
}

// Families of opcodes: every opcode whose table entry has all of `mask`
// (and, when set, the transport).
struct Family {
  std::string_view name;
  uint32_t mask;
  std::optional<wire::Transport> transport;
};

constexpr Family kFamilies[] = {
    {"SEND", wire::kSendMask, {}},
    {"WRITE", wire::kWriteMask, {}},
    {"RDMA_WRITE", wire::kWriteMask, {}},
    {"READ", wire::kReadMask, {}},
    {"READ_REQUEST", wire::kReadMask | wire::kRequestMask, {}},
    {"READ_RESPONSE", wire::kReadMask | wire::kResponseMask, {}},
    {"ATOMIC", wire::kAtomicMask | wire::kRequestMask, {}},
    {"ATOMIC_ACK", wire::kAtomicMask | wire::kAckMask, {}},
    {"ACK", wire::kAckMask, {}},
    {"REQUEST", wire::kRequestMask, {}},
    {"RESPONSE", wire::kResponseMask, {}},
    {"RC", 0, wire::Transport::kRc},
    {"UC", 0, wire::Transport::kUc},
    {"UD", 0, wire::Transport::kUd},
    {"XRC", 0, wire::Transport::kXrc},
};

// The IBA name without its transport prefix: RC_SEND_ONLY -> SEND_ONLY,
// XRC_SEND_ONLY -> SEND_ONLY.
std::string_view Operation(std::string_view name) { return name.substr(name.find('_') + 1); }

Status Op(std::string_view value, Item& item) {
  Filter& f = item.rule.filter;
  f.any_opcode = false;
  std::vector<std::string> names;
  for (std::string_view piece : Split(value, "|")) {
    const std::string name = Upper(piece);
    bool found = false;
    for (const wire::OpcodeInfo& info : wire::kOpcodeTable) {
      if (!info.valid()) continue;
      if (info.name == name || Operation(info.name) == name) {
        f.opcodes[static_cast<uint8_t>(info.opcode)] = true;
        found = true;
      }
    }
    for (const Family& fam : kFamilies) {
      if (fam.name != name) continue;
      for (const wire::OpcodeInfo& info : wire::kOpcodeTable) {
        if (!info.valid() || !info.Has(fam.mask)) continue;
        if (fam.transport && info.transport != *fam.transport) continue;
        f.opcodes[static_cast<uint8_t>(info.opcode)] = true;
      }
      found = true;
    }
    if (!found) {
      std::string families;
      for (const Family& fam : kFamilies) families += fmt::format("{}{}", families.empty() ? "" : ", ", fam.name);
      return InvalidArgument(fmt::format(
          "op: unknown opcode \"{}\" (known: an opcode of the IBA table with or without its "
          "transport, e.g. RC_RDMA_READ_RESPONSE_ONLY or RDMA_READ_RESPONSE_ONLY, or a family: {})",
          piece, families));
    }
    names.push_back(name);
  }
  f.op_text = fmt::format("{}", fmt::join(names, "|"));
  return Status::Ok();
}

struct FilterKey {
  std::string_view name;
  FilterParser parse;
};

constexpr FilterKey kFilterKeys[] = {
    {"dir", Dir}, {"dev", Dev}, {"port", Port}, {"qpn", QpnFilter}, {"dst_qpn", DstQpnFilter},
    {"op", Op},
};

// ---------------------------------------------------------------------------

// key[=value] -> key, optional value.
std::pair<std::string, std::optional<std::string_view>> KeyValue(std::string_view token) {
  const size_t eq = token.find('=');
  if (eq == std::string_view::npos) return {Lower(token), std::nullopt};
  return {Lower(Trim(token.substr(0, eq))), Trim(token.substr(eq + 1))};
}

Status ParseItem(std::string_view text, Item& item) {
  const size_t at = text.find('@');
  std::string_view effects = text.substr(0, at);
  for (std::string_view token : Split(effects, ",")) {
    if (token.empty()) return InvalidArgument("an empty fault between commas");
    auto [key, value] = KeyValue(token);
    auto it = std::find_if(std::begin(kEffectKeys), std::end(kEffectKeys),
                           // Named in an init-capture: clang before 16 cannot
                           // capture a structured binding (the fuzz build's clang-14).
                           [&name = key](const EffectKey& k) { return k.name == name; });
    if (it == std::end(kEffectKeys)) {
      return InvalidArgument(fmt::format("unknown fault \"{}\" (known: {})", key, KnownEffects()));
    }
    if (std::find(item.keys_seen.begin(), item.keys_seen.end(), key) != item.keys_seen.end()) {
      return InvalidArgument(fmt::format("\"{}\" is given twice (write a second rule after ';')", key));
    }
    item.keys_seen.push_back(key);
    if (Status s = it->parse(key, value, item); !s.ok()) return s;
  }
  if (at != std::string_view::npos) {
    for (std::string_view token : Split(text.substr(at + 1), ",")) {
      if (token.empty()) return InvalidArgument("an empty filter between commas");
      auto [key, value] = KeyValue(token);
      auto it = std::find_if(std::begin(kFilterKeys), std::end(kFilterKeys),
                             [&name = key](const FilterKey& k) { return k.name == name; });
      if (it == std::end(kFilterKeys)) {
        return InvalidArgument(fmt::format("unknown filter \"{}\" (known: {})", key, KnownFilters()));
      }
      if (!value) return InvalidArgument(fmt::format("filter \"{}\" needs a value ({}=...)", key, key));
      if (std::find(item.keys_seen.begin(), item.keys_seen.end(), key) != item.keys_seen.end()) {
        return InvalidArgument(fmt::format("filter \"{}\" is given twice", key));
      }
      item.keys_seen.push_back(key);
      if (Status s = it->parse(*value, item); !s.ok()) return s;
    }
  }
  // Check what the combination means.
  const Filter& f = item.rule.filter;
  const bool filtered = at != std::string_view::npos;
  if (item.shaped && (item.packet || item.forced)) {
    return InvalidArgument("rate and latency shape a port: give them in a rule of their own (after ';')");
  }
  if (item.shaped && (item.dir_given || f.qpn || f.dst_qpn || !f.any_opcode)) {
    return InvalidArgument("rate and latency shape a whole port: filter them by dev= and port= only");
  }
  if (item.forced && item.packet) {
    return InvalidArgument(
        "forced events (rnr, nak, error) act on a QP, not on packets: give them in a rule of their "
        "own (after ';')");
  }
  if (item.forced) {
    if (item.dir_given && f.dir != kRx) {
      return InvalidArgument("rnr, nak and error act on what a QP receives: they take no dir=tx");
    }
    item.rule.filter.dir = kRx;
  }
  if (item.seed && filtered) return InvalidArgument("seed is for the whole set: it takes no filter");
  if (!item.packet && !item.forced && !item.shaped && !item.seed) {
    return InvalidArgument("a rule needs at least one fault before '@'");
  }
  return Status::Ok();
}

std::string FormatDuration(Duration d) {
  const int64_t ns = d.count();
  if (ns != 0 && ns % 1000000000 == 0) return fmt::format("{}s", ns / 1000000000);
  if (ns != 0 && ns % 1000000 == 0) return fmt::format("{}ms", ns / 1000000);
  if (ns != 0 && ns % 1000 == 0) return fmt::format("{}us", ns / 1000);
  return fmt::format("{}ns", ns);
}

std::string FormatTrigger(const Trigger& t) {
  switch (t.kind) {
    case Trigger::Kind::kAlways: return "";
    case Trigger::Kind::kProbability: return fmt::format("{}", t.probability);
    case Trigger::Kind::kCount:
      if (t.last == t.first) return fmt::format("#{}", t.first);
      if (t.last == std::numeric_limits<uint64_t>::max()) return fmt::format("#{}..", t.first);
      return fmt::format("#{}..{}", t.first, t.last);
  }
  return "";
}

std::string FormatRate(uint64_t bps) {
  constexpr std::pair<uint64_t, std::string_view> kUnits[] = {
      {1000000000000, "tbps"}, {1000000000, "gbps"}, {1000000, "mbps"}, {1000, "kbps"}};
  for (auto [scale, name] : kUnits) {
    if (bps % scale == 0) return fmt::format("{}{}", bps / scale, name);
  }
  return fmt::format("{}bps", bps);
}

}  // namespace

std::string KnownEffects() {
  std::string out;
  for (const EffectKey& k : kEffectKeys) out += fmt::format("{}{}", out.empty() ? "" : ", ", k.name);
  return out;
}

std::string KnownFilters() {
  std::string out;
  for (const FilterKey& k : kFilterKeys) out += fmt::format("{}{}", out.empty() ? "" : ", ", k.name);
  return out;
}

Result<RuleSet> ParseRules(std::string_view text) {
  RuleSet set;
  for (std::string_view piece : Split(text, ";\n")) {
    if (piece.empty()) continue;
    Item item;
    if (Status s = ParseItem(piece, item); !s.ok()) {
      return InvalidArgument(fmt::format("\"{}\": {}", piece, s.message()));
    }
    if (item.seed) {
      if (set.seed && *set.seed != *item.seed) {
        return InvalidArgument(fmt::format("\"{}\": a second seed ({} and {})", piece, *set.seed, *item.seed));
      }
      set.seed = item.seed;
    }
    if (item.packet || item.forced) set.rules.push_back(std::move(item.rule));
    if (item.shaped) set.shaping.push_back(item.shaping);
  }
  return set;
}

std::string_view ToString(Action action) {
  switch (action) {
    case Action::kDrop: return "drop";
    case Action::kDup: return "dup";
    case Action::kCorrupt: return "corrupt";
    case Action::kReorder: return "reorder";
    case Action::kDelay: return "delay";
    case Action::kRnr: return "rnr";
    case Action::kNak: return "nak";
    case Action::kError: return "error";
  }
  return "?";
}

std::string ToString(const Rule& rule) {
  std::vector<std::string> effects;
  bool forced = false;
  for (const Effect& e : rule.effects) {
    forced = forced || IsForced(e.action);
    const std::string trigger = FormatTrigger(e.trigger);
    std::string s(ToString(e.action));
    if (e.action == Action::kDelay) {
      s += "=" + FormatDuration(e.delay);
      if (e.jitter.count() != 0) s += "~" + FormatDuration(e.jitter);
      if (!trigger.empty()) s += "/" + trigger;
    } else if (e.action == Action::kNak) {
      auto it = std::find_if(std::begin(kNakNames), std::end(kNakNames),
                             [&](const NakName& n) { return n.code == e.nak; });
      s += "=" + std::string(it == std::end(kNakNames) ? "?" : it->name);
      if (!trigger.empty()) s += "/" + trigger;
    } else if (!trigger.empty()) {
      s += "=" + trigger;
    }
    effects.push_back(std::move(s));
  }
  std::vector<std::string> filters;
  const Filter& f = rule.filter;
  if (!forced && f.dir != kTx) filters.push_back(f.dir == kRx ? "dir=rx" : "dir=both");
  if (f.device) filters.push_back("dev=" + *f.device);
  if (f.port) filters.push_back(fmt::format("port={}", *f.port));
  if (f.qpn) filters.push_back(fmt::format("qpn={:#x}", *f.qpn));
  if (f.dst_qpn) filters.push_back(fmt::format("dst_qpn={:#x}", *f.dst_qpn));
  if (!f.any_opcode) filters.push_back("op=" + f.op_text);
  std::string out = fmt::format("{}", fmt::join(effects, ","));
  if (!filters.empty()) out += fmt::format("@{}", fmt::join(filters, ","));
  return out;
}

std::string ToString(const Shaping& s) {
  std::vector<std::string> parts;
  if (s.rate_set) parts.push_back(s.rate_auto ? "rate=auto" : s.rate_bps == 0 ? "rate=off" : "rate=" + FormatRate(s.rate_bps));
  if (s.latency_set) parts.push_back("latency=" + FormatDuration(s.latency));
  std::vector<std::string> filters;
  if (s.device) filters.push_back("dev=" + *s.device);
  if (s.port) filters.push_back(fmt::format("port={}", *s.port));
  std::string out = fmt::format("{}", fmt::join(parts, ","));
  if (!filters.empty()) out += fmt::format("@{}", fmt::join(filters, ","));
  return out;
}

}  // namespace rdmaemu::fault
