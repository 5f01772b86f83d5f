#include "emulator/fault/injector.h"

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "emulator/fault/parse.h"
#include "emulator/wire/opcode.h"

namespace rdmaemu::fault {
namespace {

void Bump(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

bool HasOnRequest(const Rule& r) {
  return std::any_of(r.effects.begin(), r.effects.end(), [](const Effect& e) {
    return e.action == Action::kRnr || e.action == Action::kNak;
  });
}

}  // namespace

void CorruptPacket(std::span<uint8_t> packet, uint64_t hash) {
  if (packet.size() < wire::kBthBytes + wire::kIcrcBytes) {
    if (!packet.empty()) packet.back() ^= 1;
    return;
  }
  size_t payload_begin = 0;
  size_t payload_len = 0;
  if (const wire::OpcodeInfo* info = wire::FindOpcode(packet[0])) {
    const size_t pad = (packet[1] >> 4) & 3;
    const size_t fixed = info->length + pad + wire::kIcrcBytes;
    if (packet.size() > fixed) {
      payload_begin = info->length;
      payload_len = packet.size() - fixed;
    }
  }
  if (payload_len > 0) {
    const uint64_t bit = hash % (payload_len * 8);
    packet[payload_begin + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  } else {
    const uint64_t bit = hash % (wire::kIcrcBytes * 8);
    packet[packet.size() - wire::kIcrcBytes + bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  }
}

Injector::Injector(std::string device, std::vector<uint64_t> auto_rates)
    : device_(std::move(device)), auto_rates_(std::move(auto_rates)) {
  ports_.resize(auto_rates_.size());
  port_shaping_.resize(auto_rates_.size());
}

Status Injector::Add(std::string_view text) {
  auto set = ParseRules(text);
  if (!set.ok()) return set.status();
  // A rule for this device may only name ports it has.
  const size_t ports = auto_rates_.size();
  auto check_port = [&](const std::optional<std::string>& dev, std::optional<uint8_t> port,
                        const std::string& rule) -> Status {
    if (port && (!dev || *dev == device_) && *port > ports) {
      return InvalidArgument(fmt::format("\"{}\": port={}: {} has {} port{}", rule, *port, device_,
                                         ports, ports == 1 ? "" : "s"));
    }
    return Status::Ok();
  };
  for (const Rule& r : set->rules) {
    if (Status s = check_port(r.filter.device, r.filter.port, ToString(r)); !s.ok()) return s;
  }
  for (const Shaping& sh : set->shaping) {
    if (Status s = check_port(sh.device, sh.port, ToString(sh)); !s.ok()) return s;
  }
  std::lock_guard lock(mu_);
  if (set->seed) {
    seed_ = *set->seed;
    seed_set_ = set->seed;
  }
  for (Rule& r : set->rules) {
    Installed in;
    in.text = ToString(r);
    in.forced = std::any_of(r.effects.begin(), r.effects.end(),
                            [](const Effect& e) { return IsForced(e.action); });
    in.on_request = HasOnRequest(r);
    in.rule = std::move(r);
    rules_.push_back(std::move(in));
  }
  for (Shaping& sh : set->shaping) shaping_.push_back(std::move(sh));
  Recompute();
  return Status::Ok();
}

void Injector::Clear() {
  std::lock_guard lock(mu_);
  rules_.clear();
  shaping_.clear();
  seed_ = kDefaultSeed;
  seed_set_.reset();
  Recompute();
}

std::string Injector::List() const {
  std::lock_guard lock(mu_);
  std::string out;
  if (rules_.empty() && shaping_.empty()) return out;
  out += fmt::format("seed={}{}\n", seed_, seed_set_ ? "" : " (default)");
  for (const Installed& r : rules_) {
    out += fmt::format("{}  (matched {} packet{})\n", r.text, r.matched, r.matched == 1 ? "" : "s");
  }
  for (const Shaping& sh : shaping_) out += ToString(sh) + "\n";
  return out;
}

FaultCounters Injector::counters() const {
  auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  FaultCounters c;
  c.dropped = get(counters_.dropped);
  c.duplicated = get(counters_.duplicated);
  c.corrupted = get(counters_.corrupted);
  c.delayed = get(counters_.delayed);
  c.reordered = get(counters_.reordered);
  c.rnr_forced = get(counters_.rnr_forced);
  c.naks_forced = get(counters_.naks_forced);
  c.errors_forced = get(counters_.errors_forced);
  c.shaped = get(counters_.shaped);
  c.overflows = get(counters_.overflows);
  return c;
}

void Injector::Recompute() {
  bool shaping_on = false;
  for (size_t p = 0; p < port_shaping_.size(); ++p) {
    uint64_t rate = 0;
    Duration latency{0};
    for (const Shaping& sh : shaping_) {
      if (sh.device && *sh.device != device_) continue;
      if (sh.port && *sh.port != p + 1) continue;
      if (sh.rate_set) rate = sh.rate_auto ? auto_rates_[p] : sh.rate_bps;
      if (sh.latency_set) latency = sh.latency;
    }
    port_shaping_[p] = {rate, latency};
    shaping_on = shaping_on || rate != 0 || latency.count() != 0;
  }
  shaping_changed_ = true;
  active_.store(!rules_.empty() || shaping_on, std::memory_order_relaxed);
}

void Injector::LogDecision(const PacketMeta& meta, const Verdict& v) {
  if (!Log().should_log(spdlog::level::debug)) return;
  uint64_t suppressed = 0;
  if (!decision_lines_.Allow(&suppressed)) return;
  if (suppressed > 0) {
    Log().debug("{}: {} fault decision lines suppressed (more than {} a second)", device_,
                suppressed, kDecisionLinesPerSecond);
  }
  std::string what;
  auto add = [&](std::string_view s) {
    if (!what.empty()) what += '+';
    what += s;
  };
  if (v.drop) add("drop");
  if (v.copies > 1) add(fmt::format("dup x{}", v.copies));
  if (v.corrupt) add("corrupt");
  if (v.delay.count() > 0) {
    add(fmt::format("delay {}us",
                    std::chrono::duration_cast<std::chrono::microseconds>(v.delay).count()));
  }
  if (v.reorder_after > 0) add(fmt::format("reorder after {}", v.reorder_after));
  if (meta.dir == kTx) {
    Log().debug("{} qp#{} fault: {} tx {} psn {} → qp#{} (sending #{})", device_, meta.local_qpn,
                what, wire::OpcodeName(meta.opcode), meta.psn, meta.dst_qpn, v.occurrence + 1);
  } else {
    Log().debug("{} qp#{} fault: {} rx {} psn {} (arrival #{})", device_, meta.local_qpn, what,
                wire::OpcodeName(meta.opcode), meta.psn, v.occurrence + 1);
  }
}

bool Injector::Matches(const Filter& f, const PacketMeta& meta) const {
  return (f.dir & meta.dir) != 0 && (!f.device || *f.device == device_) &&
         (!f.port || *f.port == meta.port) && (!f.qpn || *f.qpn == meta.local_qpn) &&
         (!f.dst_qpn || *f.dst_qpn == meta.dst_qpn) && (f.any_opcode || f.opcodes[meta.opcode]);
}

Injector::Verdict Injector::Decide(const PacketMeta& meta) {
  Verdict v;
  if (shaping_changed_) {
    for (size_t p = 0; p < ports_.size(); ++p) {
      ports_[p].shaper.Configure(port_shaping_[p].first, port_shaping_[p].second);
    }
    shaping_changed_ = false;
  }
  if (rules_.empty()) return v;
  const PacketId id{meta.dir, meta.dst_qpn, meta.psn, meta.opcode,
                    seen_.Next(meta.dir, meta.dst_qpn, meta.psn, meta.opcode)};
  v.occurrence = id.occurrence;
  for (size_t i = 0; i < rules_.size(); ++i) {
    Installed& r = rules_[i];
    if (r.forced || !Matches(r.rule.filter, meta)) continue;
    ++r.matched;
    for (size_t j = 0; j < r.rule.effects.size(); ++j) {
      const Effect& e = r.rule.effects[j];
      const uint64_t h = DecisionHash(seed_, static_cast<uint32_t>(i), static_cast<uint32_t>(j), id);
      if (!Fires(e.trigger, h, r.matched)) continue;
      switch (e.action) {
        case Action::kDrop: v.drop = true; break;
        case Action::kDup: ++v.copies; break;
        case Action::kCorrupt:
          v.corrupt = true;
          v.corrupt_hash = h;
          break;
        case Action::kDelay: v.delay += DelayOf(e, h); break;
        case Action::kReorder:
          v.reorder_after = 1 + static_cast<uint32_t>((h >> 7) % kReorderMaxPackets);
          break;
        case Action::kRnr: case Action::kNak: case Action::kError: break;
      }
    }
  }
  return v;
}

std::optional<Forced> Injector::DecideForced(const PacketMeta& meta, bool request) {
  if (!active()) return std::nullopt;
  std::lock_guard lock(mu_);
  bool occurrence_taken = false;
  PacketId id{meta.dir, meta.dst_qpn, meta.psn, meta.opcode, 0};
  for (size_t i = 0; i < rules_.size(); ++i) {
    Installed& r = rules_[i];
    if (!r.forced || r.on_request != request || !Matches(r.rule.filter, meta)) continue;
    if (!occurrence_taken) {
      // Counted separately from the packet effects' table: a request seen
      // again (retransmitted after an RNR NAK) gets a fresh decision.
      id.occurrence = seen_forced_.Next(meta.dir, meta.dst_qpn, meta.psn, meta.opcode);
      occurrence_taken = true;
    }
    ++r.matched;
    for (size_t j = 0; j < r.rule.effects.size(); ++j) {
      const Effect& e = r.rule.effects[j];
      const uint64_t h = DecisionHash(seed_, static_cast<uint32_t>(i), static_cast<uint32_t>(j), id);
      if (!Fires(e.trigger, h, r.matched)) continue;
      switch (e.action) {
        case Action::kRnr: Bump(counters_.rnr_forced); break;
        case Action::kNak: Bump(counters_.naks_forced); break;
        case Action::kError: Bump(counters_.errors_forced); break;
        default: continue;
      }
      return Forced{e.action, e.nak, r.text};
    }
  }
  return std::nullopt;
}

std::optional<Forced> Injector::ForcedOnPacket(const PacketMeta& meta) {
  return DecideForced(meta, false);
}

std::optional<Forced> Injector::ForcedOnRequest(const PacketMeta& meta) {
  return DecideForced(meta, true);
}

void Injector::Note(FaultEvent what, uint8_t port, uint32_t local_qpn, PacketSink& sink,
                    uint64_t n) {
  // The device-wide counter of each FaultEvent, in the enum's order.
  static constexpr std::atomic<uint64_t> Counters::*kDevice[] = {
      &Counters::dropped,   &Counters::duplicated, &Counters::corrupted, &Counters::delayed,
      &Counters::reordered, &Counters::shaped,     &Counters::overflows};
  static_assert(std::size(kDevice) == static_cast<size_t>(FaultEvent::kOverflow) + 1);
  Bump(counters_.*kDevice[static_cast<size_t>(what)], n);
  sink.Counted(what, port, local_qpn, n);
}

void Injector::Hold(Held&& h, Clock::time_point at, PacketSink& sink) {
  const Direction dir = h.dir;
  if (held_count_[dir] >= kMaxHeld) {
    Note(FaultEvent::kOverflow, h.port, h.local_qpn, sink);
    return;
  }
  const HeldKey key{at, next_seq_++};
  if (h.after_packets > 0) reordering_[dir].push_back(key);
  held_.emplace(key, std::move(h));
  ++held_count_[dir];
}

void Injector::PassNow(const Held& h, PacketSink& sink) {
  if (h.dir == kTx) {
    sink.SendNow(h.port, h.peer, h.bytes, h.tos);
  } else {
    // Back to the engine as the port's socket received it.
    sink.Deliver(net::Datagram{h.peer, h.dst, h.bytes, h.port - 1, h.tos});
  }
}

void Injector::Pass(Held&& h, Clock::time_point now, PacketSink& sink) {
  if (h.dir == kTx && h.port >= 1 && h.port <= ports_.size()) {
    PortState& ps = ports_[h.port - 1];
    if (ps.shaper.enabled()) {
      const Clock::time_point at = ps.shaper.Schedule(now, h.bytes.size());
      if (!ps.queue.empty() || at > now + kShaperBurst) {
        if (ps.queue.size() >= kMaxHeld) {
          Note(FaultEvent::kOverflow, h.port, h.local_qpn, sink);
          return;
        }
        Note(FaultEvent::kShaped, h.port, h.local_qpn, sink);
        ps.queue.emplace_back(at, std::move(h));
        return;
      }
    }
  }
  PassNow(h, sink);
}

void Injector::CountPassing(Direction dir, Clock::time_point now, PacketSink& sink) {
  auto& keys = reordering_[dir];
  if (keys.empty()) return;
  std::vector<HeldKey> due;
  for (const HeldKey& k : keys) {
    auto it = held_.find(k);
    if (it != held_.end() && --it->second.after_packets == 0) due.push_back(k);
  }
  for (const HeldKey& k : due) {
    keys.erase(std::find(keys.begin(), keys.end(), k));
    auto node = held_.extract(k);
    --held_count_[dir];
    Pass(std::move(node.mapped()), now, sink);
  }
}

void Injector::Egress(const PacketMeta& meta, std::span<uint8_t> bytes, const sockaddr_in& to,
                      Clock::time_point now, PacketSink& sink) {
  Verdict v;
  {
    std::lock_guard lock(mu_);
    v = Decide(meta);
  }
  if (v.any()) LogDecision(meta, v);
  if (v.drop) {
    Note(FaultEvent::kDropped, meta.port, meta.local_qpn, sink);
    return;
  }
  if (v.corrupt) {
    CorruptPacket(bytes, v.corrupt_hash);
    Note(FaultEvent::kCorrupted, meta.port, meta.local_qpn, sink);
  }
  if (v.copies > 1) Note(FaultEvent::kDuplicated, meta.port, meta.local_qpn, sink, v.copies - 1);
  const bool held = v.delay.count() > 0 || v.reorder_after > 0;
  for (uint32_t i = 0; i < v.copies; ++i) {
    Held h;
    h.dir = kTx;
    h.port = meta.port;
    h.local_qpn = meta.local_qpn;
    h.peer = to;
    h.tos = meta.tos;
    h.bytes.assign(bytes.begin(), bytes.end());
    if (held) {
      h.after_packets = v.reorder_after;
      Hold(std::move(h), now + v.delay + (v.reorder_after > 0 ? kReorderMaxHold : Duration(0)),
           sink);
    } else {
      Pass(std::move(h), now, sink);
    }
  }
  if (held) {
    Note(v.reorder_after > 0 ? FaultEvent::kReordered : FaultEvent::kDelayed, meta.port,
         meta.local_qpn, sink);
  } else {
    CountPassing(kTx, now, sink);
  }
}

void Injector::Ingress(const PacketMeta& meta, const net::Datagram& d, Clock::time_point now,
                       PacketSink& sink) {
  Verdict v;
  {
    std::lock_guard lock(mu_);
    v = Decide(meta);
  }
  if (v.any()) LogDecision(meta, v);
  if (v.drop) {
    Note(FaultEvent::kDropped, meta.port, meta.local_qpn, sink);
    return;
  }
  net::Datagram datagram = d;
  std::vector<uint8_t> copy;
  if (v.corrupt) {
    copy.assign(d.data.begin(), d.data.end());
    CorruptPacket(copy, v.corrupt_hash);
    datagram.data = copy;
    Note(FaultEvent::kCorrupted, meta.port, meta.local_qpn, sink);
  }
  if (v.copies > 1) Note(FaultEvent::kDuplicated, meta.port, meta.local_qpn, sink, v.copies - 1);
  const bool held = v.delay.count() > 0 || v.reorder_after > 0;
  for (uint32_t i = 0; i < v.copies; ++i) {
    if (held) {
      Held h;
      h.dir = kRx;
      h.port = meta.port;
      h.local_qpn = meta.local_qpn;
      h.peer = datagram.src;
      h.dst = datagram.dst;
      h.tos = datagram.tos;
      h.bytes.assign(datagram.data.begin(), datagram.data.end());
      h.after_packets = v.reorder_after;
      Hold(std::move(h), now + v.delay + (v.reorder_after > 0 ? kReorderMaxHold : Duration(0)),
           sink);
    } else {
      sink.Deliver(datagram);
    }
  }
  if (held) {
    Note(v.reorder_after > 0 ? FaultEvent::kReordered : FaultEvent::kDelayed, meta.port,
         meta.local_qpn, sink);
  } else {
    CountPassing(kRx, now, sink);
  }
}

std::optional<Clock::time_point> Injector::Flush(Clock::time_point now, PacketSink& sink) {
  while (!held_.empty() && held_.begin()->first.first <= now) {
    auto node = held_.extract(held_.begin());
    const Direction dir = node.mapped().dir;
    --held_count_[dir];
    if (node.mapped().after_packets > 0) {
      auto& keys = reordering_[dir];
      keys.erase(std::find(keys.begin(), keys.end(), node.key()));
    }
    Pass(std::move(node.mapped()), now, sink);
  }
  std::optional<Clock::time_point> next;
  if (!held_.empty()) next = held_.begin()->first.first;
  for (PortState& ps : ports_) {
    while (!ps.queue.empty() && ps.queue.front().first <= now + kShaperBurst) {
      PassNow(ps.queue.front().second, sink);
      ps.queue.pop_front();
    }
    if (!ps.queue.empty()) {
      const Clock::time_point at = ps.queue.front().first - kShaperBurst;
      if (!next || at < *next) next = at;
    }
  }
  return next;
}

}  // namespace rdmaemu::fault
