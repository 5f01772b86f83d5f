// rdmaemu/rdmaemu.h's port and device operations (what a subnet manager, a
// cable or the firmware does to a real device), and the dead-device rule
// every other verb applies after a fatal error.
#include <arpa/inet.h>

#include <cstring>

#include <fmt/format.h>

#include "emulator/base/log.h"
#include "provider/objects.h"
#include "provider/provider.h"

namespace rdmaemu::provider {
namespace {

device::Device& DeviceOf(ibv_context* context) { return *ToContext(context)->device; }

// The C API's errno convention, with the reason logged where the caller
// will look for it.
int Report(const char* function, const Status& s) {
  if (!s.ok()) Log().warn("{}: {}", function, s.message());
  return s.code();
}

}  // namespace

Status DeadDevice(ibv_context* context, std::string_view verb) {
  const device::Device& dev = DeviceOf(context);
  if (!dev.dead()) return Status::Ok();
  // As the kernel answers every command on a device disassociated after a
  // fatal error; destroy verbs, close, poll_cq and get_async_event still work
  // so that the application can clean up.
  RDMAEMU_WARN_LIMITED("{}: {} had a fatal error (DEVICE_FATAL): EIO; only destroy, close, poll_cq and "
                       "ibv_get_async_event work on it now", verb, dev.name());
  return Status::Error(EIO, fmt::format("{} is dead after a fatal error", dev.name()));
}

int SetPortLid(ibv_context* context, uint8_t port, uint16_t lid) {
  return Report("rdmaemu_set_port_lid", DeviceOf(context).SetLid(port, lid));
}

int SetSmLid(ibv_context* context, uint8_t port, uint16_t sm_lid) {
  return Report("rdmaemu_set_sm_lid", DeviceOf(context).SetSmLid(port, sm_lid));
}

int ClientReregister(ibv_context* context, uint8_t port) {
  return Report("rdmaemu_client_reregister", DeviceOf(context).ClientReregister(port));
}

int SetPkey(ibv_context* context, uint8_t port, uint16_t index, uint16_t pkey) {
  return Report("rdmaemu_set_pkey", DeviceOf(context).SetPkey(port, index, pkey));
}

int SetPortSpeed(ibv_context* context, uint8_t port, uint8_t speed, uint8_t width) {
  device::Device& dev = DeviceOf(context);
  if ((speed == 0 || width == 0) && dev.ValidPort(port)) {
    // 0 keeps the current value, so one of the two can change alone.
    device::PortAttr now = dev.QueryPort(port);
    if (speed == 0) speed = now.speed;
    if (width == 0) width = now.width;
  }
  return Report("rdmaemu_set_port_speed", dev.SetLinkSpeed(port, speed, width));
}

int QueryPortAddress(ibv_context* context, uint8_t port, in_addr* address, int* fixed) {
  const device::Device& dev = DeviceOf(context);
  if (!dev.ValidPort(port)) {
    Log().warn("rdmaemu_query_port_address: {} has no port {} (ports 1..{}): EINVAL", dev.name(), port,
               dev.num_ports());
    return EINVAL;
  }
  if (address != nullptr) *address = dev.PortAddress(port).sin_addr;
  if (fixed != nullptr) *fixed = dev.PortAddressFixed(port) ? 1 : 0;
  return 0;
}

int SetGid(ibv_context* context, uint8_t port, int index, const ibv_gid& gid) {
  device::Gid g;
  std::memcpy(g.raw.data(), gid.raw, 16);
  return Report("rdmaemu_set_gid", DeviceOf(context).SetGid(port, index, g));
}

int ClearGid(ibv_context* context, uint8_t port, int index) {
  return Report("rdmaemu_clear_gid", DeviceOf(context).ClearGid(port, index));
}

int DeviceFatal(ibv_context* context, const char* why) {
  DeviceOf(context).Fatal(why != nullptr && *why != '\0' ? why : "rdmaemu_device_fatal");
  return 0;
}

}  // namespace rdmaemu::provider
