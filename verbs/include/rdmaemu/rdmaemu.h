/* rdmaemu.h: the emulated device's own extension to verbs, as mlx5dv.h is
 * for mlx5: operations a test drives from inside its process.
 *
 * Link against rdmaemu's libibverbs.so.1 (they are exported under the
 * version nodes RDMAEMU_1.0 and, from rdmaemu_query_port_address on,
 * RDMAEMU_1.1). Every function returns 0 or an errno value. */
#ifndef RDMAEMU_RDMAEMU_H
#define RDMAEMU_RDMAEMU_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Takes a port down or brings it up, as a cable pulled or plugged: the
 * port's state changes (ibv_query_port), every context of the device gets
 * IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE, and while the port is down
 * no packet leaves or enters it (RC QPs retry, then fail).
 * EINVAL: no such port, or a state other than IBV_PORT_DOWN / IBV_PORT_ACTIVE. */
int rdmaemu_set_port_state(struct ibv_context *context, uint8_t port_num,
			   enum ibv_port_state state);

/* Raises an async event on demand, for testing event handlers: the event
 * is delivered exactly as one from a real cause (to the context that owns
 * the element, or to every context of the device for port and device
 * events). The element must be an object of `context` (or a valid port).
 * EINVAL: an unknown event type, or an element that does not fit it. */
int rdmaemu_raise_async_event(struct ibv_context *context,
			      const struct ibv_async_event *event);

/* Counters of a device, a port or a QP. Set `size` to
 * sizeof(struct rdmaemu_counters) before the call: the library fills the
 * fields that fit in `size` bytes and sets `size` to the bytes it filled, so
 * a program built against an older header (fewer fields) keeps working and
 * a newer one learns which fields an older library filled. New fields are
 * only ever appended.
 *
 * Packets and bytes are RoCEv2 packets as they cross the UDP socket (bytes
 * from the BTH to the ICRC). A QP counts what reached it or left it; a port
 * counts everything that crossed it, including packets no QP accepted. */
struct rdmaemu_counters {
	uint32_t size;			/* in: the caller's size; out: bytes filled */
	uint32_t reserved;
	uint64_t packets_sent;
	uint64_t bytes_sent;
	uint64_t packets_received;
	uint64_t bytes_received;
	uint64_t retransmissions;	/* request packets sent again */
	uint64_t timeouts;		/* transport timer expiries */
	uint64_t rnr_naks_sent;
	uint64_t rnr_naks_received;
	uint64_t out_of_sequence;	/* PSN past the expected one */
	uint64_t duplicates;		/* duplicate requests */
	uint64_t dropped_malformed;
	uint64_t dropped_icrc;		/* ICRC mismatch */
	uint64_t dropped_pkey;		/* P_Key violation */
	uint64_t dropped_qkey;		/* Q_Key violation (UD) */
	uint64_t rkey_violations;	/* requests NAKed: rkey, bounds, access */
	uint64_t dropped_unknown_qpn;
	uint64_t dropped_bad_state;	/* wrong QP state, transport or source */
	uint64_t dropped_no_receive;	/* UD/UC: no receive WQE */
	uint64_t dropped_port_down;
	uint64_t dropped_device_dead;
	uint64_t dropped_no_route;
	/* What fault rules and link shaping did (docs/faults.md), on the
	 * packet's port and its local QP: the sender of a packet sent, the
	 * destination of a packet received. */
	uint64_t fault_dropped;		/* drop */
	uint64_t fault_duplicated;	/* extra copies made by dup */
	uint64_t fault_corrupted;	/* corrupt */
	uint64_t fault_delayed;		/* held by delay */
	uint64_t fault_reordered;	/* held back by reorder */
	uint64_t fault_forced;		/* RNR NAKs, NAKs, QP errors: rnr, nak, error */
	uint64_t fault_shaped;		/* waited for the link: rate, latency */
	uint64_t fault_overflows;	/* dropped: a hold queue was full */
	uint64_t dropped_no_flow;	/* raw frames no flow rule matched */
};

/* A port's counters, or with port_num 0 the whole device's (the sum of its
 * ports). EINVAL: no such port, or `size` smaller than the two header
 * fields. */
int rdmaemu_query_counters(struct ibv_context *context, uint8_t port_num,
			   struct rdmaemu_counters *counters);

/* A QP's counters, since it was created. EINVAL as above. */
int rdmaemu_query_qp_counters(struct ibv_qp *qp, struct rdmaemu_counters *counters);

/* Fault rules and link shaping on the context's device (the syntax of
 * RDMAEMU_FAULTS, docs/faults.md), e.g. "drop=0.05,seed=7",
 * "drop=#3@op=READ_RESPONSE", "rnr=#1@qpn=17", "rate=10gbps@port=1".
 * rdmaemu_fault_add appends the rules (a seed replaces the current one);
 * EINVAL for a rule that does not parse, with a log line naming the bad
 * token, and then nothing changes. */
int rdmaemu_fault_add(struct ibv_context *context, const char *rules);

/* Removes every fault rule and shaping setting of the device. */
int rdmaemu_fault_clear(struct ibv_context *context);

/* Writes the active rules, one a line, with how many packets each matched,
 * NUL-terminated into buf ("" when there are none). ERANGE when len is too
 * small (buf then holds as much as fits, still NUL-terminated). */
int rdmaemu_fault_list(struct ibv_context *context, char *buf, size_t len);

/* The subnet manager of an InfiniBand link layer port (configured with
 * link_layer=infiniband) gives the port a new LID (IBV_EVENT_LID_CHANGE),
 * moves the subnet manager to another LID (IBV_EVENT_SM_CHANGE), or asks
 * every client to register again (IBV_EVENT_CLIENT_REREGISTER); every
 * context of the device gets the event with element.port_num = port_num,
 * and ibv_query_port shows the new lid / sm_lid. A port's new LID is how
 * LID-routed peers (an AV or AH without a GRH) reach it from then on, in
 * every process on the machine; its old LID reaches nobody.
 * EINVAL: no such port; a RoCE (Ethernet link layer) port, which has no
 * LIDs; a LID that is not unicast (0, 0xC000..0xFFFF).
 * EADDRINUSE: another port of the emulated subnet has that LID.
 * EIO: the device had a fatal error. */
int rdmaemu_set_port_lid(struct ibv_context *context, uint8_t port_num,
			 uint16_t lid);
int rdmaemu_set_sm_lid(struct ibv_context *context, uint8_t port_num,
		       uint16_t sm_lid);
int rdmaemu_client_reregister(struct ibv_context *context, uint8_t port_num);

/* Writes P_Key table entry `index` of an InfiniBand port (16 entries; index
 * 0 starts as the default P_Key 0xFFFF), in host byte order (ibv_query_pkey
 * returns network order); 0 empties the entry. Every context gets
 * IBV_EVENT_PKEY_CHANGE. From then on a QP whose pkey_index names the entry
 * sends that P_Key, and drops (counting bad_pkey_cntr in ibv_query_port)
 * packets whose P_Key does not match it (IBA 10.9.3: same low 15 bits, one
 * of the two a full member).
 * EINVAL: no such port, a RoCE port (one fixed P_Key), an index outside the
 * table, or 0x8000 (the invalid P_Key). EIO: the device had a fatal error. */
int rdmaemu_set_pkey(struct ibv_context *context, uint8_t port_num,
		     uint16_t index, uint16_t pkey);

/* Changes the port's active link speed and width, as when a link retrains;
 * ibv_query_port shows the new active_speed / active_width and every context
 * gets IBV_EVENT_DEVICE_SPEED_CHANGE with element.port_num = port_num. Values
 * are the IBA encodings of struct ibv_port_attr: speed SDR 1, DDR 2, QDR 4,
 * FDR10 8, FDR 16, EDR 32, HDR 64, NDR 128; width 1x 1, 4x 2, 8x 4, 12x 8,
 * 2x 16; 0 keeps the current value. Both link layers.
 * EINVAL: no such port, or a value that is not one of those.
 * EIO: the device had a fatal error. */
int rdmaemu_set_port_speed(struct ibv_context *context, uint8_t port_num,
			   uint8_t active_speed, uint8_t active_width);

/* Sets or clears GID table entry `index` (1..15), as when an address is
 * added to or removed from a RoCE interface; ibv_query_gid,
 * ibv_query_gid_ex and ibv_query_gid_table show it and every context gets
 * IBV_EVENT_GID_CHANGE with element.port_num = port_num (none when nothing
 * changed). The port keeps sending from and receiving on its own address,
 * GID 0, which can be neither set nor cleared.
 * EINVAL: no such port, an index outside the table, the zero GID or a
 * multicast GID. EBUSY: index 0. EEXIST: the GID is at another index.
 * EIO: the device had a fatal error. */
int rdmaemu_set_gid(struct ibv_context *context, uint8_t port_num, int index,
		    const union ibv_gid *gid);
int rdmaemu_clear_gid(struct ibv_context *context, uint8_t port_num,
		      int index);

/* A fatal device error, for good (until every context of the device is
 * closed): every QP of the device moves to IBV_QPS_ERR and its posted work
 * completes with IBV_WC_WR_FLUSH_ERR, nothing is sent or received, and every
 * context gets IBV_EVENT_DEVICE_FATAL. Afterwards verbs fail as on a dead
 * device: creation, modify and query verbs (and ibv_open_device) with EIO,
 * while destroy verbs, ibv_close_device, ibv_poll_cq and
 * ibv_get_async_event still work so that the application can clean up.
 * `reason` (may be NULL) goes into the log line. Returns 0 (also when the
 * device is already dead). */
int rdmaemu_device_fatal(struct ibv_context *context, const char *reason);

/* The IPv4 address a RoCE port's socket is bound to (network order) and
 * whether it is fixed (*fixed = 1: the configuration file's address=,
 * RDMAEMU_ADDRESS, or rdma_bind_addr before the device opened) or was
 * picked when the device opened (*fixed = 0: the first free address of
 * 127.0.0.0/8, so another process opening the same device gets another
 * one). Either pointer may be NULL. EINVAL for a port the device lacks. */
int rdmaemu_query_port_address(struct ibv_context *context, uint8_t port_num,
			       struct in_addr *address, int *fixed);

/* The resource_type a parent domain's alloc and free callbacks are called
 * with (ibv_alloc_parent_domain(3); the device-specific kinds, as mlx5dv.h's
 * MLX5DV_RES_TYPE_*): the ring of completions of a CQ created on the parent
 * domain (ibv_create_cq_ex with IBV_CQ_INIT_ATTR_MASK_PD), asked for at
 * creation and at each ibv_resize_cq, given back at destroy and resize. */
#define RDMAEMU_RES_TYPE_CQ ((((uint64_t)0x656d75) << 32) + 1)

#ifdef __cplusplus
}
#endif

#endif /* RDMAEMU_RDMAEMU_H */
