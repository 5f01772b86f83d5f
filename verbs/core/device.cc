// Device list and contexts: ibv_get_device_list … ibv_close_device.
#include <endian.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "emulator/base/log.h"
#include "provider/check/check.h"
#include "provider/check/ops.h"
#include "provider/check/registered.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

namespace rdmaemu::verbs {
namespace {

struct Device {
  ibv_device ibv;  // must be first
  int index;
  uint64_t guid;   // host order
};

// The list is built once and its ibv_device pointers never move or die:
// programs keep them after ibv_free_device_list (pyverbs frees the list
// right after opening a device).
std::mutex g_devices_mu;
std::vector<Device*>* g_devices = nullptr;  // guarded by g_devices_mu; never freed

Result<std::vector<Device*>*> Devices() {
  std::lock_guard lock(g_devices_mu);
  if (g_devices != nullptr) return g_devices;
  auto listed = provider::ListDevices();
  if (!listed.ok()) return listed.status();
  auto* devices = new std::vector<Device*>();
  int index = 0;
  for (const auto& entry : *listed) {
    auto* d = new Device{};
    d->ibv.node_type = IBV_NODE_CA;
    d->ibv.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d->ibv.name, sizeof d->ibv.name, "%s", entry.name.c_str());
    std::snprintf(d->ibv.dev_name, sizeof d->ibv.dev_name, "uverbs%d", index);
    // There is no sysfs for an emulated device; these are the paths a real
    // one would have, and reads of them fail as for a missing attribute.
    std::snprintf(d->ibv.dev_path, sizeof d->ibv.dev_path,
                  "/sys/class/infiniband_verbs/uverbs%d", index);
    std::snprintf(d->ibv.ibdev_path, sizeof d->ibv.ibdev_path, "/sys/class/infiniband/%s",
                  entry.name.c_str());
    d->index = index++;
    d->guid = entry.guid;
    devices->push_back(d);
  }
  g_devices = devices;
  return g_devices;
}

Device* ToDevice(ibv_device* d) { return reinterpret_cast<Device*>(d); }

void DeliverCompletion(ibv_cq* cq) {
  ibv_async_event ev{};
  ev.element.cq = cq;
  ToChannel(cq->channel)->events.Push(ev, cq);
}

void DeliverAsync(ibv_context* context, const ibv_async_event& event) {
  const void* object = nullptr;
  switch (ElementOf(event.event_type)) {
    case EventElement::kCq: object = event.element.cq; break;
    case EventElement::kQp: object = event.element.qp; break;
    case EventElement::kSrq: object = event.element.srq; break;
    case EventElement::kWq: object = event.element.wq; break;
    case EventElement::kPort: break;
  }
  Private(context)->async_events.Push(event, object);
}

// libibverbs' wrappers around provider ops, installed after the provider's.
int CompatQueryDevice(ibv_context* context, ibv_device_attr* attr) {
  return ibv_query_device(context, attr);
}

}  // namespace

EventElement ElementOf(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_CQ_ERR:
      return EventElement::kCq;
    case IBV_EVENT_QP_FATAL: case IBV_EVENT_QP_REQ_ERR: case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST: case IBV_EVENT_SQ_DRAINED: case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR: case IBV_EVENT_QP_LAST_WQE_REACHED:
      return EventElement::kQp;
    case IBV_EVENT_SRQ_ERR: case IBV_EVENT_SRQ_LIMIT_REACHED:
      return EventElement::kSrq;
    case IBV_EVENT_WQ_FATAL:
      return EventElement::kWq;
    default:
      return EventElement::kPort;  // port and device events
  }
}

}  // namespace rdmaemu::verbs

using namespace rdmaemu;
using namespace rdmaemu::verbs;

extern "C" {

#undef ibv_query_port
int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* port_attr);

ibv_device** ibv_get_device_list(int* num_devices) {
  auto devices = Devices();
  if (!devices.ok()) {
    Log().error("no devices: {}", devices.status().message());
    if (num_devices) *num_devices = 0;
    errno = devices.status().code();
    return nullptr;
  }
  size_t n = (*devices)->size();
  auto** list = static_cast<ibv_device**>(std::calloc(n + 1, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i) list[i] = &(**devices)[i]->ibv;
  if (num_devices) *num_devices = static_cast<int>(n);
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device->name; }

__be64 ibv_get_device_guid(ibv_device* device) { return htobe64(ToDevice(device)->guid); }

int ibv_get_device_index(ibv_device* device) { return ToDevice(device)->index; }

ibv_context* ibv_open_device(ibv_device* device) { return OpenContext(device, -1, nullptr); }

}  // extern "C"

namespace rdmaemu::verbs {

ibv_context* OpenContext(ibv_device* device, int cmd_fd, ibv_context* imported_from) {
  static std::once_flag hooks_once;
  std::call_once(hooks_once, [] { provider::SetEventHooks({DeliverCompletion, DeliverAsync}); });

  Device* dev = ToDevice(device);
  auto allocated = provider::AllocContext(dev->index, imported_from);
  if (!allocated.ok()) {
    Log().error("cannot open {}: {}", device->name, allocated.status().message());
    errno = allocated.status().code();
    return nullptr;
  }
  verbs_context* vctx = *allocated;
  auto* priv = new verbs_ex_private();
  if (Status s = priv->async_events.Open(); !s.ok()) {
    delete priv;
    provider::FreeContext(vctx);
    errno = s.code();
    return nullptr;
  }
  // A kernel device's context has /dev/infiniband/uverbsN open as cmd_fd,
  // and programs use it as an fd (dup it to share the context with
  // ibv_import_device, poll it, pass it on). Ours is an empty memory file
  // named after the device (/proc/PID/fd shows "memfd:rdmaemu-emu0"): a
  // real descriptor that goes with the context; nothing is read from it.
  // An imported context keeps the one it was given.
  const std::string cmd_name = std::string("rdmaemu-") + device->name;
  if (cmd_fd < 0) cmd_fd = ::memfd_create(cmd_name.c_str(), MFD_CLOEXEC);
  if (cmd_fd < 0) {
    const int err = errno;
    Log().error("cannot open {}: no descriptor for its cmd_fd: {}", device->name, std::strerror(err));
    delete priv;
    provider::FreeContext(vctx);
    errno = err;
    return nullptr;
  }
  vctx->priv = priv;
  vctx->sz = sizeof(verbs_context);
  ibv_context& ctx = vctx->context;
  ctx.device = device;
  ctx.cmd_fd = cmd_fd;
  ctx.async_fd = priv->async_events.fd();
  ctx.num_comp_vectors = 1;
  ctx.abi_compat = reinterpret_cast<void*>(std::numeric_limits<uintptr_t>::max());
  pthread_mutex_init(&ctx.mutex, nullptr);

  InstallDummyOps(vctx);
  provider::InstallOps(vctx);
  if (check::On()) check::WrapOps(vctx);
  // The library's own entry points in the slots rdma-core fills itself.
  ctx.ops._compat_query_device = CompatQueryDevice;
  ctx.ops._compat_query_port = ibv_query_port;
  vctx->create_cq_ex = LibCreateCqEx;
  vctx->create_qp_ex = LibCreateQpEx;
  InstallWqSlots(vctx);
  InstallXrcSlots(vctx);
  provider::StartContext(vctx);
  RegisterCmdFd(&ctx);
  Log().debug("{} {} (async fd {})", imported_from != nullptr ? "imported" : "opened", device->name,
              ctx.async_fd);
  return &ctx;
}

}  // namespace rdmaemu::verbs

extern "C" {

int ibv_close_device(ibv_context* context) {
  if (!provider::LiveHandle(context, provider::Kind::kContext, "ibv_close_device")) {
    return FailInt(kNoSuchObjectToDestroy);
  }
  verbs_context* vctx = ToVerbsContext(context);
  verbs_ex_private* priv = vctx->priv;
  const int cmd_fd = context->cmd_fd;
  ForgetCmdFd(context);
  if (check::On()) check::ContextMemoryReleased(context);
  pthread_mutex_destroy(&context->mutex);
  provider::FreeContext(vctx);
  delete priv;
  ::close(cmd_fd);
  return 0;
}

}  // extern "C"
