// Every object pointer the library handed out, and what it is. The kernel
// looks up each handle a program passes (uverbs' per-file table) and a NIC's
// stack therefore refuses a destroyed, foreign or made-up object with an
// errno; here the pointer is the handle, so every slow-path entry point looks
// it up before following it. A copy of an object has another address and is
// refused too. The fast path (posting, polling, ibv_wr_*) trusts what was
// checked when its objects were created, as a NIC's does.
#pragma once

#include <infiniband/verbs.h>

#include <string>
#include <vector>

namespace rdmaemu::provider {

enum class Kind { kContext, kPd, kMr, kCq, kCompChannel, kQp, kSrq, kAh, kWq, kRwqIndTable, kMw,
                  kDm, kTd, kXrcd, kFlow };

// "PD", "CQ", "completion channel", ...: what log lines call a kind.
const char* KindName(Kind kind);

// `object` is live from AddHandle until RemoveHandle. A context's objects
// stop being live when it closes (CloseHandles): like the kernel, which
// destroys them with the file, the library refuses them from then on; their
// memory is kept, not freed, so that what a program still holds is never
// reused under it.
void AddHandle(const void* object, Kind kind, ibv_context* context);
void RemoveHandle(const void* object);
void CloseHandles(ibv_context* context);

// A CQ, QP, SRQ or WQ is destroyed in two steps, with a wait for the events
// the program read to be acknowledged between them: RetireHandle at the
// first refuses it to every verb but the acknowledgements (AckableHandle),
// which that wait needs; RemoveHandle at the second.
void RetireHandle(const void* object);
bool AckableHandle(const void* object, Kind kind, const char* verb);

// "qp#17", "cq#3", "mr lkey 0x201": how reports name a live object.
std::string HandleName(const void* object, Kind kind);

// True if `object` is being destroyed (between RetireHandle and
// RemoveHandle); says nothing in the log.
bool Retired(const void* object);

// Every live (not retired) object of `kind` (the checker's scans at exit).
std::vector<const void*> LiveHandles(Kind kind);

// Marks a live object as librdmacm's own (its per-device context and PD,
// kept for the process's life): the checker's leak scan skips it.
void MarkLibraryObject(const void* object);

// The context of the live `kind` at `object`; NULL, with a line naming
// `verb` and the object (`what`, e.g. "send_cq"; the kind's name if NULL),
// when `object` is NULL, destroyed, a copy, made up, of another kind, or its
// context closed. The pointer is never followed.
ibv_context* LiveHandle(const void* object, Kind kind, const char* verb, const char* what = nullptr);

// LiveHandle, and the object must belong to `context` (a device opened
// twice gives two contexts whose objects do not mix).
bool HandleOf(const void* object, Kind kind, ibv_context* context, const char* verb,
              const char* what = nullptr);

}  // namespace rdmaemu::provider
