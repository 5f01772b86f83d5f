// The verbs checker's RDMA CM checks (check.h): the bridge to libibverbs'
// checker. The checks themselves sit where the mistakes are seen (id.cc,
// channel.cc).
#include "verbs/rdmacm/check.h"

#include "emulator/cm/uapi.h"
#include "verbs/rdmacm/library.h"

namespace rdmaemu::rdmacm {

bool CheckOn() {
  static const bool on = rdmaemu_cm_check_on() != 0;
  return on;
}

void CheckReport(const char* kind, const std::string& what) {
  rdmaemu_cm_check_report(kind, what.c_str());
}

void CheckLibraryObject(const void* object) {
  if (CheckOn()) rdmaemu_cm_check_library_object(object);
}

void CheckTrack(const void* object, const std::string& name) {
  if (CheckOn()) rdmaemu_cm_check_track(object, name.c_str());
}

void CheckUntrack(const void* object) {
  if (CheckOn()) rdmaemu_cm_check_untrack(object);
}

}  // namespace rdmaemu::rdmacm
