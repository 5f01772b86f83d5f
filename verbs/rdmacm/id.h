// cm ids: the private struct behind each rdma_cm_id, its event accounting
// (reported/acked, destroy waits for the acks) and its connection state.
//
// Thread safety: `reported`/`acked` (and each multicast membership's) are
// guarded by `mu` (the device's threads never touch them); `memberships`
// by `mc_mu`, since rdma_leave_multicast may run while another thread reads
// the join's event; `route` is read by the device's threads when they
// deliver. Everything else is the application's, which uses an id from one
// thread at a time, as rdma-core requires.
#pragma once

#include <rdma/rdma_cma.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "emulator/cm/uapi.h"
#include "verbs/rdmacm/channel.h"

namespace rdmaemu::rdmacm {

struct Device;
struct Membership;  // multicast.h

// Where an id is in the CM's life (the kernel's enum rdma_cm_state, as far
// as the library needs it; the device checks the wire states).
enum class State {
  kIdle,           // created
  kBound,          // rdma_bind_addr
  kAddrResolved,   // rdma_resolve_addr
  kRouteResolved,  // rdma_resolve_route
  kConnect,        // active: REQ / SIDR_REQ sent
  kListen,         // rdma_listen
  kRequest,        // passive: a CONNECT_REQUEST not answered yet
  kAccepted,       // passive: REP sent, waiting for the RTU
  kEstablished,    // connected
  kDisconnected,   // DREQ sent or received
};
const char* StateName(State state);

struct Id {
  rdma_cm_id id{};  // first: what the application holds

  uint32_t handle = 0;      // the device's id
  bool has_handle = false;  // the device knows it (false once destroyed)
  bool sync = false;        // the channel is this id's own (sync mode)
  std::atomic<Channel*> route{nullptr};  // where deliveries go

  std::mutex mu;
  std::condition_variable acked_cv;
  uint32_t reported = 0;  // events the application took; guarded by mu
  uint32_t acked = 0;     // events it acked; guarded by mu

  State state = State::kIdle;
  Device* device = nullptr;   // bound to this device (NULL: any-address)
  bool bound = false;
  uint32_t psn = 0;           // own starting (receive) PSN, 24 bits
  uint8_t tos = 0;
  bool tos_set = false;
  int ack_timeout = -1;       // RDMA_OPTION_ID_ACK_TIMEOUT, -1 if unset
  uint8_t responder_resources = 0;  // negotiated: ours for the peer's reads
  uint8_t initiator_depth = 0;      // negotiated: our reads outstanding

  // The peer's side of the connection (its REQ on the passive side, its
  // REP on the active side), once known.
  bool have_peer = false;
  uint32_t peer_qpn = 0;
  uint32_t peer_psn = 0;
  uint8_t path_mtu = IBV_MTU_1024;       // the connection's MTU (enum ibv_mtu)
  uint8_t qp_timeout = 19;               // RTS timeout: the REQ's local ACK timeout
  uint8_t retry_count = 7;               // RTS retry_cnt: the REQ's
  uint8_t rnr_retry_count = 7;           // RTS rnr_retry: the peer's
  bool connect_error = false;            // CONNECT_RESPONSE failed: drop its aftermath

  ibv_sa_path_rec path{};  // route.path_rec points here once resolved

  // rdma_create_ep: the QP attributes rdma_get_request creates with.
  bool has_qp_init_attr = false;
  ibv_qp_init_attr qp_init_attr{};
  // rdma_create_ep: rdma_addrinfo's ai_connect, put before the private data.
  std::vector<uint8_t> connect_data;

  ibv_ece local_ece{};

  // Multicast groups joined (rdma_join_multicast), newest last.
  std::mutex mc_mu;
  std::vector<Membership*> memberships;  // guarded by mc_mu
};

inline Id* ToId(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }

// Whether `id` (not NULL) is an id this library made and has not destroyed.
// The kernel looks up every id a program passes in its table (ucma's
// xarray); here too a destroyed, copied or made-up pointer fails with
// EINVAL and a line naming `verb`, and is never followed. An id's memory
// reused for a new id is that new id.
bool LiveId(const rdma_cm_id* id, const char* verb);

// A new id with its device id; `channel` NULL makes a private channel (sync
// mode). Returns NULL with errno.
Id* NewId(rdma_event_channel* channel, void* context, rdma_port_space ps,
          ibv_qp_type qp_type);

// Disposes of the queued events of `id` (a listener's queued requests
// destroy their children), then waits until every event reported for it is
// acked, logging after a second which id waits for how many.
void DiscardAndWait(Id* id, const char* what);

// Waits until every event reported for `id` is acked (the second half of
// DiscardAndWait; rdma_migrate_id waits this way too).
void WaitForAcks(Id* id, const char* what);

// Makes a library event for `id` (ADDR_RESOLVED, ROUTE_RESOLVED, ...) and
// queues it on the id's channel. Returns 0 or an errno value.
int QueueLibraryEvent(Id* id, rdma_cm_event_type type, int status);

// A fresh 24-bit starting PSN.
uint32_t RandomPsn();

// The function the device delivers through (rdmaemu_cm_init).
uint64_t DeliverFromDevice(const rdmaemu_cm_event* event);

// The sync-mode completion (rdma-core's ucma_complete, sync.cc): acks
// id->event, takes the next event into it, maps a failure to errno.
// Returns 0 at once for ids on an application channel.
int Complete(Id* id);

// Processing of CONNECT_RESPONSE inside rdma_get_cm_event (connect.cc):
// with a QP, moves it INIT/RTR/RTS and sends the RTU, and makes the event
// ESTABLISHED (CONNECT_ERROR if a step fails).
void ProcessConnectResponse(Event* event);

// Fill event->event.param from what the device reported: conn (RC/UC:
// the peer's initiator depth is our responder resources and vice versa)
// or ud (the AH to reach the peer, from the id's route).
void CopyConnParam(Event* event);
void CopyUdParam(Event* event);
// Acknowledges an event the application never saw (skipped by the library).
void AckInternally(Event* event);

// Moves id->qp INIT→INIT (access flags), RTR and RTS (qp.cc), with the
// negotiated depths unless RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH; 0 (also
// without a QP) or an errno value.
int MoveQpToRts(Id* id, uint8_t responder_resources, uint8_t initiator_depth);

// Moves id->qp to ERR (rdma_disconnect, REJECTED); 0 if there is none.
int ModifyQpToError(Id* id);

}  // namespace rdmaemu::rdmacm
