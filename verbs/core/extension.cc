// rdmaemu/rdmaemu.h: the emulated device's own verbs extension.
#include "rdmaemu/rdmaemu.h"

#include <cstddef>
#include <cstring>

#include "emulator/engine/counters.h"
#include "provider/handles.h"
#include "provider/provider.h"

namespace {

// The C struct carries exactly the engine's counter list, in its order.
#define RDMAEMU_CHECK_FIELD(name, text) \
  static_assert(sizeof(rdmaemu_counters::name) == sizeof(uint64_t), #name " missing");
RDMAEMU_COUNTERS(RDMAEMU_CHECK_FIELD)
#undef RDMAEMU_CHECK_FIELD
#define RDMAEMU_ONE(name, text) +1
constexpr size_t kCounterCount = 0 RDMAEMU_COUNTERS(RDMAEMU_ONE);
#undef RDMAEMU_ONE
static_assert(sizeof(rdmaemu_counters) == offsetof(rdmaemu_counters, packets_sent) + 8 * kCounterCount,
              "struct rdmaemu_counters and RDMAEMU_COUNTERS disagree");

static_assert(RDMAEMU_RES_TYPE_CQ == rdmaemu::provider::kCqRingResourceType);

constexpr size_t kCounterHeader = offsetof(rdmaemu_counters, packets_sent);

// Copies what fits in the caller's `size` (see rdmaemu.h) and says so.
int Fill(const rdmaemu::engine::CounterValues& v, rdmaemu_counters* out) {
  rdmaemu_counters full{};
#define RDMAEMU_COPY(name, text) full.name = v.name;
  RDMAEMU_COUNTERS(RDMAEMU_COPY)
#undef RDMAEMU_COPY
  // Whole fields only: a caller's struct ends on a field boundary.
  size_t n = std::min<size_t>(out->size, sizeof(full));
  n = kCounterHeader + (n - kCounterHeader) / 8 * 8;
  full.size = static_cast<uint32_t>(n);
  full.reserved = 0;
  std::memcpy(out, &full, n);
  return 0;
}

bool SizeOk(const rdmaemu_counters* c) { return c != nullptr && c->size >= kCounterHeader; }

}  // namespace

extern "C" {

int rdmaemu_set_port_state(ibv_context* context, uint8_t port_num, ibv_port_state state) {
  return rdmaemu::provider::SetPortState(context, port_num, state);
}

int rdmaemu_raise_async_event(ibv_context* context, const ibv_async_event* event) {
  if (event == nullptr) return EINVAL;
  return rdmaemu::provider::RaiseAsyncEvent(context, *event);
}

int rdmaemu_query_counters(ibv_context* context, uint8_t port_num, rdmaemu_counters* counters) {
  if (context == nullptr || !SizeOk(counters)) return EINVAL;
  auto v = rdmaemu::provider::QueryCounters(context, port_num);
  if (!v.ok()) return v.status().code();
  return Fill(*v, counters);
}

int rdmaemu_query_qp_counters(ibv_qp* qp, rdmaemu_counters* counters) {
  if (!SizeOk(counters)) return EINVAL;
  if (!rdmaemu::provider::LiveHandle(qp, rdmaemu::provider::Kind::kQp, "rdmaemu_query_qp_counters")) {
    return EINVAL;
  }
  return Fill(rdmaemu::provider::QueryQpCounters(qp), counters);
}

int rdmaemu_fault_add(ibv_context* context, const char* rules) {
  if (context == nullptr || rules == nullptr) return EINVAL;
  return rdmaemu::provider::FaultAdd(context, rules);
}

int rdmaemu_fault_clear(ibv_context* context) {
  if (context == nullptr) return EINVAL;
  return rdmaemu::provider::FaultClear(context);
}

int rdmaemu_fault_list(ibv_context* context, char* buf, size_t len) {
  if (context == nullptr || (buf == nullptr && len != 0)) return EINVAL;
  return rdmaemu::provider::FaultList(context, buf, len);
}

int rdmaemu_set_port_lid(ibv_context* context, uint8_t port_num, uint16_t lid) {
  return rdmaemu::provider::SetPortLid(context, port_num, lid);
}

int rdmaemu_set_sm_lid(ibv_context* context, uint8_t port_num, uint16_t sm_lid) {
  return rdmaemu::provider::SetSmLid(context, port_num, sm_lid);
}

int rdmaemu_client_reregister(ibv_context* context, uint8_t port_num) {
  return rdmaemu::provider::ClientReregister(context, port_num);
}

int rdmaemu_set_pkey(ibv_context* context, uint8_t port_num, uint16_t index, uint16_t pkey) {
  return rdmaemu::provider::SetPkey(context, port_num, index, pkey);
}

int rdmaemu_set_port_speed(ibv_context* context, uint8_t port_num, uint8_t active_speed,
                           uint8_t active_width) {
  return rdmaemu::provider::SetPortSpeed(context, port_num, active_speed, active_width);
}

int rdmaemu_query_port_address(ibv_context* context, uint8_t port_num, in_addr* address, int* fixed) {
  if (!rdmaemu::provider::LiveHandle(context, rdmaemu::provider::Kind::kContext, "rdmaemu_query_port_address")) {
    return EINVAL;
  }
  return rdmaemu::provider::QueryPortAddress(context, port_num, address, fixed);
}

int rdmaemu_set_gid(ibv_context* context, uint8_t port_num, int index, const ibv_gid* gid) {
  if (gid == nullptr) return EINVAL;
  return rdmaemu::provider::SetGid(context, port_num, index, *gid);
}

int rdmaemu_clear_gid(ibv_context* context, uint8_t port_num, int index) {
  return rdmaemu::provider::ClearGid(context, port_num, index);
}

int rdmaemu_device_fatal(ibv_context* context, const char* reason) {
  return rdmaemu::provider::DeviceFatal(context, reason);
}

}  // extern "C"
