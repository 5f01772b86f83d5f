// The connection manager's commands (emulator/cm/uapi.h), as libibverbs.so.1
// exports them for rdmaemu's librdmacm.so.1: the translation from contexts
// and devices to the manager's device indexes, and from Status to errno.
#include <infiniband/verbs.h>

#include "emulator/base/log.h"
#include "emulator/cm/manager.h"
#include "emulator/device/device.h"
#include "provider/objects.h"
#include "provider/provider.h"

namespace rdmaemu::provider {

namespace {

// The device commands log what was wrong (at info: librdmacm logs its
// own view of the failure, as a warning, where the application erred).
int Errno(const Status& s, std::string_view command) {
  if (s.ok()) return 0;
  Log().info("{}: {}", command, s.message());
  return s.code();
}

}  // namespace

int CmInit(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver) {
  return Errno(cm::Manager::Get().Init(abi_version, deliver), "rdmaemu_cm_init");
}

int CmCreateId(uint64_t handle, uint16_t ps, uint32_t* id) {
  if (id == nullptr) return EINVAL;
  auto r = cm::Manager::Get().CreateId(handle, ps);
  if (!r.ok()) return Errno(r.status(), "rdmaemu_cm_create_id");
  *id = *r;
  return 0;
}

int CmDestroyId(uint32_t id) { return Errno(cm::Manager::Get().DestroyId(id), "rdmaemu_cm_destroy_id"); }

int CmBind(uint32_t id, ibv_context* context, uint8_t port_num, sockaddr_in* addr) {
  int device = -1;
  if (context != nullptr) {
    // The context keeps its engine, and so the device's attachment to the
    // manager, until it closes.
    device = ToContext(context)->device->index();
  }
  return Errno(cm::Manager::Get().Bind(id, device, port_num, addr), "rdmaemu_cm_bind");
}

int CmListen(uint32_t id, int backlog) { return Errno(cm::Manager::Get().Listen(id, backlog), "rdmaemu_cm_listen"); }

int CmConnect(uint32_t id, const sockaddr_in* dst, const rdmaemu_cm_param* param) {
  if (dst == nullptr || param == nullptr) return EINVAL;
  return Errno(cm::Manager::Get().Connect(id, *dst, *param), "rdmaemu_cm_connect");
}

int CmAccept(uint32_t id, const rdmaemu_cm_param* param) {
  if (param == nullptr) return EINVAL;
  return Errno(cm::Manager::Get().Accept(id, *param), "rdmaemu_cm_accept");
}

int CmReject(uint32_t id, uint16_t reason, const void* data, uint8_t len) {
  if (data == nullptr && len != 0) return EINVAL;
  const auto* bytes = static_cast<const uint8_t*>(data);
  return Errno(cm::Manager::Get().Reject(id, reason, std::span<const uint8_t>(bytes, bytes == nullptr ? 0 : len)),
               "rdmaemu_cm_reject");
}

int CmEstablish(uint32_t id) { return Errno(cm::Manager::Get().Establish(id), "rdmaemu_cm_establish"); }

int CmDisconnect(uint32_t id) { return Errno(cm::Manager::Get().Disconnect(id), "rdmaemu_cm_disconnect"); }

int CmSetOption(uint32_t id, int name, uint32_t value) {
  return Errno(cm::Manager::Get().SetOption(id, name, value), "rdmaemu_cm_set_option");
}

int CmClaimAddress(int device_index, in_addr addr) {
  return Errno(device::Registry::Get().ClaimAddress(device_index, addr), "rdmaemu_cm_claim_address");
}

}  // namespace rdmaemu::provider
