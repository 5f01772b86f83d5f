// libibverbs' own per-object state, beside what the provider keeps.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>

#include "provider/handles.h"
#include "verbs/core/event_queue.h"

// The library-private part of a context (verbs.h declares the type and
// leaves it to the library, as rdma-core does).
struct verbs_ex_private {
  rdmaemu::verbs::EventQueue async_events;
};

namespace rdmaemu::verbs {

struct CompChannel {
  ibv_comp_channel ibv;  // must be first
  EventQueue events;
};

inline CompChannel* ToChannel(ibv_comp_channel* c) { return reinterpret_cast<CompChannel*>(c); }
inline verbs_context* ToVerbsContext(ibv_context* c) {
  return reinterpret_cast<verbs_context*>(reinterpret_cast<char*>(c) -
                                          offsetof(verbs_context, context));
}
inline verbs_ex_private* Private(ibv_context* c) { return ToVerbsContext(c)->priv; }

// Which element an async event names (libibverbs' one mapping, as in
// rdma-core's ibv_get_async_event/ibv_ack_async_event).
enum class EventElement { kCq, kQp, kSrq, kWq, kPort };
EventElement ElementOf(ibv_event_type type);

// Opens a context on `device` (ibv_open_device, cmd_fd -1: it makes its
// own); with `imported_from`, one sharing that context's device instance
// and objects, owning `cmd_fd` (ibv_import_device). NULL with errno set.
ibv_context* OpenContext(ibv_device* device, int cmd_fd, ibv_context* imported_from);
// Which open context a cmd_fd names, for ibv_import_device (import.cc).
void RegisterCmdFd(ibv_context* context);
void ForgetCmdFd(ibv_context* context);

// Fills every op slot with a clean EOPNOTSUPP failure (dummy_ops.cc).
void InstallDummyOps(verbs_context* vctx);

// The library's create_cq_ex slot: checks, asks the provider, then sets up
// the public CQ fields as rdma-core's verbs_init_cq does (cq.cc).
ibv_cq_ex* LibCreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* attr);

// The library's create_qp_ex slot (qp.cc).
ibv_qp* LibCreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr);

// The WQ and indirection-table slots (wq.cc): destroy_wq waits for event
// acknowledgements, so the library fills them, as it does create_cq_ex.
void InstallWqSlots(verbs_context* vctx);

// The XRC slots (xrc.cc): XRC domains, XRC SRQs, ibv_open_qp.
void InstallXrcSlots(verbs_context* vctx);

// Sets errno and returns NULL: the failure convention of pointer verbs.
template <typename T>
T* FailWith(int error) {
  errno = error;
  return nullptr;
}

// Sets errno and returns `error`: how an int verb fails when the kernel
// refuses it (rdma-core returns the errno value, and the failed system call
// left it in errno too).
inline int FailInt(int error) {
  errno = error;
  return error;
}

// What each verb says for an object that is not a live one of its kind
// (provider/handles.h), as the kernel's uverbs does: a destroy looks its
// handle up for destruction and finds nothing (ENOENT); every other command
// finds no object to use (EINVAL).
constexpr int kNoSuchObjectToDestroy = ENOENT;
constexpr int kNoSuchObject = EINVAL;

// Waits, as rdma-core's destroy does, until `*completed == reported` under
// the object's mutex; logs once after a second that the destroy is waiting
// for unacknowledged events (the most common bug in event code).
void WaitForAcks(pthread_mutex_t* mutex, pthread_cond_t* cond, const unsigned* completed,
                 unsigned reported, const unsigned* completed2, unsigned reported2,
                 const char* what, const void* object);

}  // namespace rdmaemu::verbs
