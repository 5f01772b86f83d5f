/* The connection manager's command interface: what rdmaemu's librdmacm.so.1
 * asks of the device, as rdma_user_cm.h is what rdma-core's librdmacm asks of
 * the kernel's ucma. Private to rdmaemu: libibverbs.so.1 exports these
 * functions under the version node RDMAEMU_CM_PRIVATE_1.0, and only our
 * librdmacm.so.1 calls them. Applications never see this header.
 *
 * The split is the kernel's: the device side (emulator/cm) owns the ids'
 * wire state, the port spaces, the listeners, the IB CM MADs on QP1, their
 * retries and timewait; the library owns rdma_cm_id, event channels, events
 * and their acknowledgement, address and route resolution (with public
 * verbs queries), and every QP transition (with ibv_modify_qp).
 *
 * Plain C with fixed-width types, so that it means the same to both
 * libraries whatever they are compiled with. IPv4 only: every emulated GID
 * is IPv4-mapped. Addresses are in network order (sockaddr_in), everything
 * else in host order.
 *
 * Error convention: every function returns 0 or an errno value and never
 * touches errno; the device logs what was wrong. */
#ifndef RDMAEMU_CM_UAPI_H
#define RDMAEMU_CM_UAPI_H

#include <netinet/in.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RDMAEMU_CM_ABI_VERSION 1

/* The largest private data any CM message carries (REP: 196; REJ: 148;
 * REQ: 56 after the 36-byte IP header; SIDR_REQ: 180; SIDR_REP: 136). */
#define RDMAEMU_CM_MAX_PRIVATE_DATA 196

struct ibv_context;
struct ibv_device;

/* What one side offers in a REQ/REP (RC, UC) or SIDR_REQ/SIDR_REP (UD).
 * On connect and accept the library fills it; in an event it is what the
 * peer sent. */
struct rdmaemu_cm_param {
  uint32_t qp_num;       /* the sender's QP (SIDR_REP: the UD QP to send to) */
  uint32_t qkey;         /* SIDR_REP only */
  uint32_t starting_psn; /* the sender's receive PSN: the peer's sq_psn */
  uint8_t qp_type;       /* enum ibv_qp_type: RC, UC, UD, XRC_SEND, XRC_RECV */
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t flow_control;
  uint8_t retry_count;     /* REQ only */
  uint8_t rnr_retry_count;
  uint8_t srq;
  uint8_t path_mtu;        /* enum ibv_mtu; REQ only (the path's MTU) */
  uint8_t local_ack_timeout; /* REQ only: the QP timeout the active side picked */
  uint8_t private_data_len;
  uint8_t private_data[RDMAEMU_CM_MAX_PRIVATE_DATA];
};

/* One event for one id, delivered through the function given to
 * rdmaemu_cm_init. `event` and `status` have rdma_cm_event's meaning:
 *   RDMA_CM_EVENT_CONNECT_REQUEST  on a listener: `child` is a new id, bound
 *                                  on `device_index`/`port_num` with the
 *                                  addresses `src` (ours) and `dst` (the
 *                                  peer's); `param` is the peer's REQ or
 *                                  SIDR_REQ (private data without the IP
 *                                  header). The callback's return value
 *                                  becomes the child's handle; 0 refuses
 *                                  the request (a listener of another QP
 *                                  type): the device rejects it.
 *   RDMA_CM_EVENT_CONNECT_RESPONSE active RC: the REP arrived (`param`); the
 *                                  library moves the QP and calls
 *                                  rdmaemu_cm_establish (which sends RTU).
 *   RDMA_CM_EVENT_ESTABLISHED      passive RC: the RTU arrived (or
 *                                  rdmaemu_cm_establish); active UD: the
 *                                  SIDR_REP accepted (`param`: qp_num, qkey,
 *                                  private data).
 *   RDMA_CM_EVENT_REJECTED         a REJ: `status` is its reason (8 = nobody
 *                                  listens on that port), `param` its private
 *                                  data.
 *   RDMA_CM_EVENT_UNREACHABLE      no answer after every retry (status
 *                                  -ETIMEDOUT), or a SIDR_REP whose status is
 *                                  not success (status = that SIDR status).
 *   RDMA_CM_EVENT_CONNECT_ERROR    the peer broke the protocol (logged).
 *   RDMA_CM_EVENT_DISCONNECTED     a DREQ arrived, or our DREQ was answered
 *                                  or timed out.
 *   RDMA_CM_EVENT_TIMEWAIT_EXIT    the connection's timewait is over.
 * The device calls the function from its own threads, never from inside an
 * rdmaemu_cm_* call, and holds its lock meanwhile: the function must not
 * call rdmaemu_cm_*, and after rdmaemu_cm_destroy_id(id) returns no call for
 * that id is made or in progress. */
struct rdmaemu_cm_event {
  uint64_t handle; /* the handle given at create (or returned for a child) */
  uint32_t id;
  int32_t event;   /* enum rdma_cm_event_type */
  int32_t status;
  uint32_t child;  /* CONNECT_REQUEST only */
  int32_t device_index; /* CONNECT_REQUEST: ibv_get_device_index of the child's device */
  uint8_t port_num;     /* CONNECT_REQUEST: the child's port */
  struct sockaddr_in src; /* CONNECT_REQUEST: the child's local address */
  struct sockaddr_in dst; /* CONNECT_REQUEST: the child's peer address */
  struct rdmaemu_cm_param param;
};

/* rdma_cma.h's event and port space numbers, which the device cannot
 * include (it includes verbs.h); the library checks they agree. */
enum {
  RDMAEMU_CM_EVENT_CONNECT_REQUEST = 4,
  RDMAEMU_CM_EVENT_CONNECT_RESPONSE = 5,
  RDMAEMU_CM_EVENT_CONNECT_ERROR = 6,
  RDMAEMU_CM_EVENT_UNREACHABLE = 7,
  RDMAEMU_CM_EVENT_REJECTED = 8,
  RDMAEMU_CM_EVENT_ESTABLISHED = 9,
  RDMAEMU_CM_EVENT_DISCONNECTED = 10,
  RDMAEMU_CM_EVENT_TIMEWAIT_EXIT = 15,
};
enum {
  RDMAEMU_CM_PS_IPOIB = 0x0002,
  RDMAEMU_CM_PS_TCP = 0x0106,
  RDMAEMU_CM_PS_UDP = 0x0111,
  RDMAEMU_CM_PS_IB = 0x013f,
};
/* enum ibv_qp_type's numbers, likewise. */
enum {
  RDMAEMU_CM_QPT_RC = 2,
  RDMAEMU_CM_QPT_UC = 3,
  RDMAEMU_CM_QPT_UD = 4,
  RDMAEMU_CM_QPT_XRC_SEND = 9, /* connect: the REQ's transport is XRC */
  RDMAEMU_CM_QPT_XRC_RECV = 10 /* CONNECT_REQUEST of an XRC REQ; accept: REP of an XRC target */
};

typedef uint64_t (*rdmaemu_cm_deliver_fn)(const struct rdmaemu_cm_event* event);

/* Options (rdmaemu_cm_set_option). */
enum {
  RDMAEMU_CM_OPT_TOS = 0,         /* traffic class of the id's MADs (u8) */
  RDMAEMU_CM_OPT_REUSEADDR = 1,   /* bool, before bind */
  RDMAEMU_CM_OPT_AFONLY = 2,      /* bool, accepted (IPv4 only anyway) */
  RDMAEMU_CM_OPT_ACK_TIMEOUT = 3, /* the QP timeout put in the REQ (u8, 0..31) */
};

/* Once per process, before anything else: registers the event function.
 * EPROTO if the library and the device disagree on `abi_version`; EBUSY if
 * another function is registered already. */
int rdmaemu_cm_init(uint32_t abi_version, rdmaemu_cm_deliver_fn deliver);

/* A new id of port space `ps` (RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB,
 * RDMA_PS_IPOIB), bound to nothing yet. */
int rdmaemu_cm_create_id(uint64_t handle, uint16_t ps, uint32_t* id);

/* Ends the id: a connected one sends DREQ, a request not yet answered is
 * rejected, a listener stops listening; its port is released. No event for
 * it is delivered after this returns. ENOENT for an unknown id. */
int rdmaemu_cm_destroy_id(uint32_t id);

/* Binds the id to an address of this process's emulated hosts and a port of
 * its port space. `context` NULL with INADDR_ANY binds the any-address (a
 * listener on every device); otherwise the id lives on `context`'s device
 * and `port_num`, whose address `addr` must be (or INADDR_ANY). Port 0 picks
 * a free ephemeral port, written back into addr->sin_port. EADDRINUSE if the
 * port is taken (and REUSEADDR does not allow sharing it), EINVAL if the id
 * is bound already, EADDRNOTAVAIL if the address is not the device's. */
int rdmaemu_cm_bind(uint32_t id, struct ibv_context* context, uint8_t port_num,
                    struct sockaddr_in* addr);

/* Starts listening on the bound id (binding port 0 if unbound is the
 * library's business: it binds first). EINVAL if it is not bound or is
 * connecting; `backlog` <= 0 means the default (1024). */
int rdmaemu_cm_listen(uint32_t id, int backlog);

/* Sends the REQ (RC, UC) or SIDR_REQ (UD) to `dst` (address and port). The
 * id must be bound to a device (rdma_resolve_addr does it). EINVAL in the
 * wrong state or for private data too long for the message. */
int rdmaemu_cm_connect(uint32_t id, const struct sockaddr_in* dst,
                       const struct rdmaemu_cm_param* param);

/* Passive side, after CONNECT_REQUEST: sends REP (RC, UC; then RTU brings
 * ESTABLISHED) or SIDR_REP with status success (UD; no event follows). */
int rdmaemu_cm_accept(uint32_t id, const struct rdmaemu_cm_param* param);

/* Passive side: REJ with `reason` (28: consumer defined, 35: vendor option
 * not supported) or SIDR_REP with status REJECT, carrying the private data. */
int rdmaemu_cm_reject(uint32_t id, uint16_t reason, const void* private_data,
                      uint8_t private_data_len);

/* Active side after CONNECT_RESPONSE: sends RTU; the connection is
 * established. Passive side after accept: the RTU is taken as received
 * (COMM_EST) and ESTABLISHED is delivered. */
int rdmaemu_cm_establish(uint32_t id);

/* Sends DREQ when connected; answers a received DREQ with DREP. EINVAL when
 * there is no connection to end. */
int rdmaemu_cm_disconnect(uint32_t id);

/* RDMAEMU_CM_OPT_*; EINVAL for a bad name or value or a wrong moment (e.g.
 * REUSEADDR after bind). */
int rdmaemu_cm_set_option(uint32_t id, int name, uint32_t value);

/* Makes device `device`, not yet opened in this process and configured with
 * address `auto`, take `addr` when it opens (rdma_bind_addr to a 127/8
 * address is how a program picks its emulated host). EBUSY if the device is
 * open already, EINVAL if its address is configured. */
int rdmaemu_cm_claim_address(struct ibv_device* device, const struct in_addr* addr);

/* The verbs checker (docs/check.md), for the RDMA CM checks librdmacm makes
 * (its reports join libibverbs' own: one summary, one exit status). */
/* 1 when the checker is on (RDMAEMU_CHECK), else 0. */
int rdmaemu_cm_check_on(void);
/* One report of `kind` (a KIND of docs/check.md, e.g. "ack-mismatch",
 * "leak") saying `what`, with the caller's stack. */
void rdmaemu_cm_check_report(const char* kind, const char* what);
/* Runs `scan` at exit, before the checker's summary. */
void rdmaemu_cm_check_at_exit(void (*scan)(void));
/* `object`, a context or PD librdmacm keeps for the process's life, is
 * never reported as a leak. */
void rdmaemu_cm_check_library_object(const void* object);
/* `object`, an rdma_cm_id or event channel called `name` in reports, was
 * made by the caller: alive at exit, it is a leak, reported with this
 * stack. Untracked when destroyed. */
void rdmaemu_cm_check_track(const void* object, const char* name);
void rdmaemu_cm_check_untrack(const void* object);

#ifdef __cplusplus
}
#endif

#endif /* RDMAEMU_CM_UAPI_H */
