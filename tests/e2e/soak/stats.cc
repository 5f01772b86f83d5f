#include "tests/e2e/soak/stats.h"

#include <rdmaemu/rdmaemu.h>

#include <cstddef>
#include <cstring>
#include <string_view>
#include <vector>

#include "tests/e2e/soak/common.h"

namespace soak {
namespace {

struct Field {
  const char* name;
  size_t offset;
};

#define SOAK_FIELD(f) {#f, offsetof(rdmaemu_counters, f)}
constexpr Field kFields[] = {
    SOAK_FIELD(packets_sent),        SOAK_FIELD(bytes_sent),          SOAK_FIELD(packets_received),
    SOAK_FIELD(bytes_received),      SOAK_FIELD(retransmissions),     SOAK_FIELD(timeouts),
    SOAK_FIELD(rnr_naks_sent),       SOAK_FIELD(rnr_naks_received),   SOAK_FIELD(out_of_sequence),
    SOAK_FIELD(duplicates),          SOAK_FIELD(dropped_malformed),   SOAK_FIELD(dropped_icrc),
    SOAK_FIELD(dropped_pkey),        SOAK_FIELD(dropped_qkey),        SOAK_FIELD(rkey_violations),
    SOAK_FIELD(dropped_unknown_qpn), SOAK_FIELD(dropped_bad_state),   SOAK_FIELD(dropped_no_receive),
    SOAK_FIELD(dropped_port_down),   SOAK_FIELD(dropped_device_dead), SOAK_FIELD(dropped_no_route),
    // What the fault rules (RDMAEMU_FAULTS) did to this side's packets.
    SOAK_FIELD(fault_dropped),       SOAK_FIELD(fault_duplicated),    SOAK_FIELD(fault_corrupted),
    SOAK_FIELD(fault_delayed),       SOAK_FIELD(fault_reordered),     SOAK_FIELD(fault_forced),
    SOAK_FIELD(fault_shaped),        SOAK_FIELD(fault_overflows),
};
#undef SOAK_FIELD

}  // namespace

std::string DeviceCounters(ibv_context* ctx) {
  rdmaemu_counters c{};
  c.size = sizeof c;
  if (int e = rdmaemu_query_counters(ctx, 0, &c); e != 0) {
    Die(fmt::format("rdmaemu_query_counters: {}", std::strerror(e)));
  }
  std::string out;
  for (const Field& f : kFields) {
    if (f.offset + sizeof(uint64_t) > c.size) break;  // an older library filled less
    uint64_t v;
    std::memcpy(&v, reinterpret_cast<const char*>(&c) + f.offset, sizeof v);
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", f.name, v);
  }
  return out;
}

std::string FaultRules(ibv_context* ctx) {
  std::vector<char> buf(16384);
  if (int e = rdmaemu_fault_list(ctx, buf.data(), buf.size()); e != 0) {
    Die(fmt::format("rdmaemu_fault_list: {}", std::strerror(e)));
  }
  std::string out;
  for (const char* line = buf.data(); *line != '\0';) {
    const char* end = std::strchr(line, '\n');
    std::string_view rule(line, end ? static_cast<size_t>(end - line) : std::strlen(line));
    if (!rule.empty()) out += fmt::format("{}{}", out.empty() ? "" : " | ", rule);
    if (!end) break;
    line = end + 1;
  }
  return out.empty() ? "none" : out;
}

}  // namespace soak
