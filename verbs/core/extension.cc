// rdmaemu/rdmaemu.h: the emulated device's own verbs extension.
#include "rdmaemu/rdmaemu.h"

#include "provider/provider.h"

extern "C" {

int rdmaemu_set_port_state(ibv_context* context, uint8_t port_num, ibv_port_state state) {
  return rdmaemu::provider::SetPortState(context, port_num, state);
}

int rdmaemu_raise_async_event(ibv_context* context, const ibv_async_event* event) {
  if (event == nullptr) return EINVAL;
  return rdmaemu::provider::RaiseAsyncEvent(context, *event);
}

}  // extern "C"
