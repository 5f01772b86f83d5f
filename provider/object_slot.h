// One of the objects ibv_query_device limits, held while a create verb
// builds it: the slot goes back by itself on every early return, and stays
// taken once the object exists (Keep); the destroy verb returns it.
#pragma once

#include "emulator/base/log.h"
#include "emulator/device/device.h"

namespace rdmaemu::provider {

class ObjectSlot {
 public:
  using Limited = device::Device::Limited;

  // Logs, naming `verb` and the limit, when every one is in use: the create
  // then fails with ENOMEM, as on a NIC.
  ObjectSlot(device::Device& device, Limited kind, const char* verb)
      : device_(device), kind_(kind), taken_(device.TakeObject(kind)) {
    if (!taken_) {
      RDMAEMU_WARN_LIMITED("{}: all {} of {} are in use ({} in ibv_query_device): ENOMEM", verb,
                           device::Device::LimitOf(kind), device.name(), device::Device::LimitName(kind));
    }
  }
  ~ObjectSlot() {
    if (taken_ && !kept_) device_.ReturnObject(kind_);
  }
  ObjectSlot(const ObjectSlot&) = delete;
  ObjectSlot& operator=(const ObjectSlot&) = delete;

  bool ok() const { return taken_; }
  void Keep() { kept_ = true; }

 private:
  device::Device& device_;
  const Limited kind_;
  const bool taken_;
  bool kept_ = false;
};

}  // namespace rdmaemu::provider
