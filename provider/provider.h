// The provider: the driver for the emulated device, as librxe or libmlx5 are
// for theirs. libibverbs (verbs/) reaches it through this header and through
// the op slots InstallOps fills; it reaches the device through emulator/.
//
// Error convention at this boundary: int functions return 0 or an errno
// value; pointer functions return Result<T*> whose Status carries the errno.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/cm/uapi.h"
#include "emulator/engine/counters.h"

namespace rdmaemu::provider {

struct DeviceEntry {
  std::string name;
  uint64_t guid;  // host order
};

// The configured devices, in order; an invalid configuration is an error.
Result<std::vector<DeviceEntry>> ListDevices();

// How the provider hands events to libibverbs' queues. Set once, before any
// context is opened; called from the engine thread or the control plane.
struct EventHooks {
  void (*completion)(ibv_cq* cq);  // cq->channel is non-NULL
  void (*async)(ibv_context* context, const ibv_async_event& event);
};
void SetEventHooks(const EventHooks& hooks);

// Opens configured device `index`: a zeroed object whose first member is the
// verbs_context the library initialises; then InstallOps overwrites the op
// slots the provider implements; then StartContext begins event delivery.
// `imported_from`: the context ibv_import_device found behind a cmd_fd; the
// new context shares its device instance and its objects (cmd_file.h).
Result<verbs_context*> AllocContext(int index, ibv_context* imported_from = nullptr);
void InstallOps(verbs_context* vctx);
void StartContext(verbs_context* vctx);
void FreeContext(verbs_context* vctx);

// rdmaemu/rdmaemu.h: port state and async events on demand.
int SetPortState(ibv_context* context, uint8_t port, ibv_port_state state);
int RaiseAsyncEvent(ibv_context* context, const ibv_async_event& event);
// rdmaemu/rdmaemu.h: counters of a port (0 = the device) or a QP.
Result<engine::CounterValues> QueryCounters(ibv_context* context, uint8_t port);
engine::CounterValues QueryQpCounters(ibv_qp* qp);

// rdmaemu/rdmaemu.h: the device's fault rules (docs/faults.md).
int FaultAdd(ibv_context* context, const char* rules);
int FaultClear(ibv_context* context);
int FaultList(ibv_context* context, char* buf, size_t len);

// rdmaemu/rdmaemu.h: what a subnet manager, a cable or the firmware does to
// a port or the device (device_control.cc). 0 or an errno value.
int SetPortLid(ibv_context* context, uint8_t port, uint16_t lid);
int SetSmLid(ibv_context* context, uint8_t port, uint16_t sm_lid);
int ClientReregister(ibv_context* context, uint8_t port);
int SetPkey(ibv_context* context, uint8_t port, uint16_t index, uint16_t pkey);
int SetPortSpeed(ibv_context* context, uint8_t port, uint8_t speed, uint8_t width);
int QueryPortAddress(ibv_context* context, uint8_t port, in_addr* address, int* fixed);
int SetGid(ibv_context* context, uint8_t port, int index, const ibv_gid& gid);
int ClearGid(ibv_context* context, uint8_t port, int index);
int DeviceFatal(ibv_context* context, const char* why);
// After a fatal error every command but destroy fails with EIO (logged,
// naming `verb`); Ok while the device lives. libibverbs' own commands
// (ibv_create_comp_channel) ask too.
Status DeadDevice(ibv_context* context, std::string_view verb);

// Verbs that are exported functions in libibverbs (no op slot of their own).
int QueryGidEntry(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry);
int QueryGidTableLength(ibv_context* context, uint32_t port);
int QueryPkey(ibv_context* context, uint8_t port, int index, uint16_t* pkey_be);

Result<ibv_pd*> AllocPd(ibv_context* context);
// A parent domain's allocator is asked for a CQ's ring (the CQEs the device
// writes and the program polls) with this resource_type; rdmaemu.h
// publishes it as RDMAEMU_RES_TYPE_CQ.
inline constexpr uint64_t kCqRingResourceType = (uint64_t{0x656d75} << 32) + 1;  // "emu", 1
int DeallocPd(ibv_pd* pd);
// ibv_import_pd / ibv_import_mr (import.cc): a new view of the PD or MR
// whose handle `context`'s file holds; ENOENT for a handle it does not hold,
// as the kernel. Unimport releases a view and leaves the object.
Result<ibv_pd*> ImportPd(ibv_context* context, uint32_t pd_handle);
Result<ibv_mr*> ImportMr(ibv_pd* pd, uint32_t mr_handle);
void UnimportPd(ibv_pd* pd);
void UnimportMr(ibv_mr* mr);
// ibv_import_dm / ibv_unimport_dm (dm.cc): likewise for device memory; a
// view shares the DM's memory and its count of registered MRs.
Result<ibv_dm*> ImportDm(ibv_context* context, uint32_t dm_handle);
void UnimportDm(ibv_dm* dm);
Result<ibv_mr*> RegMr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access);
int ReregMr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access);
int DeregMr(ibv_mr* mr);

// The library initialises the public CQ fields (verbs_init_cq) afterwards.
Result<ibv_cq_ex*> CreateCq(ibv_context* context, const ibv_cq_init_attr_ex& attr);
int ResizeCq(ibv_cq* cq, int cqe);
// Destroying is two steps so that libibverbs can wait for event
// acknowledgements in between: Detach stops every new completion and event
// for the CQ (or fails with EBUSY while it is in use); Free releases it.
int DetachCq(ibv_cq* cq);
// Armed by ibv_req_notify_cq and not yet fired (the checker's unarmed-wait).
bool CqArmed(ibv_cq* cq);
// A thread is about to block for a completion event of `context` on the
// channel fd `channel_fd`: runs the receive side once on it, then, where
// it can, waits for the channel or a datagram itself and handles each
// datagram on its own thread (net::Loop::BeginWait), so that a datagram
// wakes this thread alone. Returns when the channel holds an event, or
// when the caller should simply block reading it (a non-blocking channel,
// the network with the engine's thread, a signal); then the engine's
// thread has the network. `queued` is the channel's queue length: read
// instead of polling the fd where a syscall would only tell the same.
void AwaitCompletionEvent(ibv_context* context, int channel_fd,
                          const std::atomic<size_t>& queued);
void FreeCq(ibv_cq* cq);

// QPs: created from the exported ibv_create_qp and the create_qp_ex slot
// (the library sets no fields afterwards: the provider initialises them).
Result<ibv_qp*> CreateQp(ibv_context* context, ibv_qp_init_attr_ex* attr);
int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int mask);
int QueryQp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init_attr);
// The QP's ibv_qp_ex if it was created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
// else NULL (as rdma-core's ibv_qp_to_qp_ex).
ibv_qp_ex* QpToQpEx(ibv_qp* qp);

// The WRs of the batch open on `qp` (between ibv_wr_start and
// ibv_wr_complete), as ibv_post_send would take them, chained through
// `next`: the checker wraps wr_complete with them. A WR whose data was
// copied inline carries no SGE (nothing of the program's is read later).
struct BatchSends {
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
};
BatchSends OpenBatch(ibv_qp_ex* qp);
// Two steps, as for CQs: Detach stops the engine using the QP; Free releases it.
int DetachQp(ibv_qp* qp);
void FreeQp(ibv_qp* qp);

// Shared receive queues, basic and XRC (an XRC SRQ completes on its own CQ
// and is published under its number, which ibv_get_srq_num reports).
Result<ibv_srq*> CreateSrq(ibv_pd* pd, ibv_srq_init_attr* attr);
Result<ibv_srq*> CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* attr);
int GetSrqNum(ibv_srq* srq, uint32_t* srq_num);
int ModifySrq(ibv_srq* srq, ibv_srq_attr* attr, int mask);
int QuerySrq(ibv_srq* srq, ibv_srq_attr* attr);
int DetachSrq(ibv_srq* srq);
void FreeSrq(ibv_srq* srq);

// Work queues (IBV_WQT_RQ) and receive indirection tables (wq.cc). The
// library initialises the WQ's mutex, cond and event count afterwards, as
// verbs.h's ibv_create_wq does. Destroying a WQ is two steps, as for CQs:
// Detach fails with EBUSY while an indirection table holds the WQ and else
// unpublishes it; Free releases it.
Result<ibv_wq*> CreateWq(ibv_context* context, ibv_wq_init_attr* attr);
int ModifyWq(ibv_wq* wq, ibv_wq_attr* attr);
int DetachWq(ibv_wq* wq);
void FreeWq(ibv_wq* wq);
// EBUSY while a QP steers through the table.
Result<ibv_rwq_ind_table*> CreateRwqIndTable(ibv_context* context,
                                            ibv_rwq_ind_table_init_attr* attr);
int DestroyRwqIndTable(ibv_rwq_ind_table* table);

// XRC domains (xrcd.cc). EBUSY while SRQs or target QPs made through the
// handle exist.
Result<ibv_xrcd*> OpenXrcd(ibv_context* context, const ibv_xrcd_init_attr& attr);
int CloseXrcd(ibv_xrcd* xrcd);
// Another handle to an XRC target QP of an XRC domain (qp.cc).
Result<ibv_qp*> OpenQp(ibv_context* context, const ibv_qp_open_attr& attr);

Result<ibv_ah*> CreateAh(ibv_pd* pd, const ibv_ah_attr& attr);
int DestroyAh(ibv_ah* ah);
// ibv_attach_mcast / ibv_detach_mcast: a UD QP joins or leaves the IPv4
// group of an IPv4-mapped multicast GID on its port. 0 or an errno value.
int AttachMcast(ibv_qp* qp, const ibv_gid& gid, uint16_t lid);
int DetachMcast(ibv_qp* qp, const ibv_gid& gid, uint16_t lid);

// The connection manager's commands for librdmacm (cm.cc): uapi.h's
// rdmaemu_cm_* with its meanings, 0 or an errno value.
int CmInit(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver);
int CmCreateId(uint64_t handle, uint16_t ps, uint32_t* id);
int CmDestroyId(uint32_t id);
int CmBind(uint32_t id, ibv_context* context, uint8_t port_num, sockaddr_in* addr);
int CmListen(uint32_t id, int backlog);
int CmConnect(uint32_t id, const sockaddr_in* dst, const rdmaemu_cm_param* param);
int CmAccept(uint32_t id, const rdmaemu_cm_param* param);
int CmReject(uint32_t id, uint16_t reason, const void* data, uint8_t len);
int CmEstablish(uint32_t id);
int CmDisconnect(uint32_t id);
int CmSetOption(uint32_t id, int name, uint32_t value);
int CmClaimAddress(int device_index, in_addr addr);

}  // namespace rdmaemu::provider
