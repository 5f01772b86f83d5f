// The verbs checker's RDMA CM checks (docs/check.md). librdmacm sees the
// mistakes, libibverbs' checker reports them (rdmaemu_cm_check_* of
// emulator/cm/uapi.h), so reports, the summary and `error`'s exit status
// are one for both libraries:
//   - ack-mismatch: rdma_ack_cm_event of an event rdma_get_cm_event never
//     returned or that was acknowledged already (rdma-core frees the event
//     at the first ack: the second is a use after free, and the id's counts
//     never match again, so its destroy hangs); a destroy that waits for
//     acknowledgements; events never acknowledged when the program exits;
//   - leak: cm ids and event channels alive at exit, each with where it was
//     made (tracked from their creation by libibverbs' leak scan).
// The library's own contexts and PDs (one per device, kept for the
// process's life as rdma-core's librdmacm keeps them) are never leaks.
#pragma once

#include <string>

namespace rdmaemu::rdmacm {

// True when the checker is on (read once, at Init).
bool CheckOn();
// One report of `kind` ("ack-mismatch", "leak") with the caller's stack.
void CheckReport(const char* kind, const std::string& what);
// Tells the checker that `object` (a context or PD) is the library's own.
void CheckLibraryObject(const void* object);
// `object` (an id or channel, named `name` in reports) was made here, and
// is a leak if alive at exit; untracked when destroyed.
void CheckTrack(const void* object, const std::string& name);
void CheckUntrack(const void* object);

}  // namespace rdmaemu::rdmacm
