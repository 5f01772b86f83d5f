// The connection manager's private commands (emulator/cm/uapi.h), exported
// under RDMAEMU_CM_PRIVATE_1.0 for rdmaemu's librdmacm.so.1 alone, as
// libibverbs exports IBVERBS_PRIVATE_* for rdma-core's providers.
#include <infiniband/verbs.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/cm/uapi.h"
#include "provider/check/check.h"
#include "provider/handles.h"
#include "provider/provider.h"

namespace {

namespace check = rdmaemu::check;

// librdmacm's ids and channels alive, with where each was made (the
// checker on): the leak scan at exit reports what is left, as
// provider/handles.cc does for the verbs objects.
struct Tracked {
  std::string name;
  std::shared_ptr<const check::Stack> created;
};
std::mutex g_tracked_mu;
auto& g_tracked = *new std::map<const void*, Tracked>();  // guarded by g_tracked_mu

void CmLeakScan() {
  constexpr size_t kShown = 3;
  std::vector<Tracked> left;
  {
    std::lock_guard lock(g_tracked_mu);
    for (const auto& [object, t] : g_tracked) left.push_back(t);
  }
  if (left.empty()) return;
  std::string names;
  std::vector<check::Note> notes;
  for (size_t i = 0; i < left.size(); ++i) {
    if (i < 8) names += fmt::format("{}{}", i == 0 ? "" : ", ", left[i].name);
    if (i < kShown) notes.push_back({fmt::format("{} was made here", left[i].name), *left[i].created});
  }
  if (left.size() > 8) names += ", ...";
  check::Stack first = notes.front().stack;
  notes.erase(notes.begin());
  check::Report(check::Kind::kLeak,
                fmt::format("{} RDMA CM object(s) still alive at exit, never destroyed: {} (first "
                            "made here; each rdma_create_id, each CONNECT_REQUEST's new id and "
                            "each rdma_create_event_channel needs its rdma_destroy_id / "
                            "rdma_destroy_event_channel)",
                            left.size(), names),
                first, notes);
}

}  // namespace

extern "C" {

int rdmaemu_cm_init(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver) {
  return rdmaemu::provider::CmInit(abi_version, deliver);
}

int rdmaemu_cm_create_id(uint64_t handle, uint16_t ps, uint32_t* id) {
  return rdmaemu::provider::CmCreateId(handle, ps, id);
}

int rdmaemu_cm_destroy_id(uint32_t id) { return rdmaemu::provider::CmDestroyId(id); }

int rdmaemu_cm_bind(uint32_t id, ibv_context* context, uint8_t port_num, sockaddr_in* addr) {
  return rdmaemu::provider::CmBind(id, context, port_num, addr);
}

int rdmaemu_cm_listen(uint32_t id, int backlog) { return rdmaemu::provider::CmListen(id, backlog); }

int rdmaemu_cm_connect(uint32_t id, const sockaddr_in* dst, const rdmaemu_cm_param* param) {
  return rdmaemu::provider::CmConnect(id, dst, param);
}

int rdmaemu_cm_accept(uint32_t id, const rdmaemu_cm_param* param) {
  return rdmaemu::provider::CmAccept(id, param);
}

int rdmaemu_cm_reject(uint32_t id, uint16_t reason, const void* private_data, uint8_t private_data_len) {
  return rdmaemu::provider::CmReject(id, reason, private_data, private_data_len);
}

int rdmaemu_cm_establish(uint32_t id) { return rdmaemu::provider::CmEstablish(id); }

int rdmaemu_cm_disconnect(uint32_t id) { return rdmaemu::provider::CmDisconnect(id); }

int rdmaemu_cm_set_option(uint32_t id, int name, uint32_t value) {
  return rdmaemu::provider::CmSetOption(id, name, value);
}

int rdmaemu_cm_claim_address(ibv_device* device, const in_addr* addr) {
  if (device == nullptr || addr == nullptr) return EINVAL;
  return rdmaemu::provider::CmClaimAddress(ibv_get_device_index(device), *addr);
}

int rdmaemu_cm_check_on(void) { return rdmaemu::check::On() ? 1 : 0; }

void rdmaemu_cm_check_report(const char* kind, const char* what) {
  if (!check::On() || kind == nullptr || what == nullptr) return;
  for (int k = 0; k < check::kKinds; ++k) {
    if (std::strcmp(check::KindName(static_cast<check::Kind>(k)), kind) == 0) {
      check::Report(static_cast<check::Kind>(k), what, check::CaptureStack());
      return;
    }
  }
  rdmaemu::Log().warn("rdmaemu_cm_check_report: no checker kind is called '{}'", kind);
}

void rdmaemu_cm_check_at_exit(void (*scan)(void)) {
  if (rdmaemu::check::On() && scan != nullptr) rdmaemu::check::AtExit(scan);
}

void rdmaemu_cm_check_library_object(const void* object) {
  if (rdmaemu::check::On()) rdmaemu::provider::MarkLibraryObject(object);
}

void rdmaemu_cm_check_track(const void* object, const char* name) {
  if (!check::On() || object == nullptr || name == nullptr) return;
  static std::once_flag once;
  std::call_once(once, [] { check::AtExit(CmLeakScan); });
  auto created = std::make_shared<const check::Stack>(check::CaptureStack());
  std::lock_guard lock(g_tracked_mu);
  g_tracked[object] = Tracked{name, std::move(created)};
}

void rdmaemu_cm_check_untrack(const void* object) {
  if (!check::On()) return;
  std::lock_guard lock(g_tracked_mu);
  g_tracked.erase(object);
}

}  // extern "C"
