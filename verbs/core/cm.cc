// The connection manager's private commands (emulator/cm/uapi.h), exported
// under RDMAEMU_CM_PRIVATE_1.0 for rdmaemu's librdmacm.so.1 alone, as
// libibverbs exports IBVERBS_PRIVATE_* for rdma-core's providers.
#include <infiniband/verbs.h>

#include "emulator/cm/uapi.h"
#include "provider/provider.h"

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

}  // extern "C"
