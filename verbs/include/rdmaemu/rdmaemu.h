/* rdmaemu.h: the emulated device's own extension to verbs, as mlx5dv.h is
 * for mlx5: operations a test drives from inside its process.
 *
 * Link against rdmaemu's libibverbs.so.1 (they are exported under the
 * version node RDMAEMU_1.0). Every function returns 0 or an errno value. */
#ifndef RDMAEMU_RDMAEMU_H
#define RDMAEMU_RDMAEMU_H

#include <infiniband/verbs.h>
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
};

/* A port's counters, or with port_num 0 the whole device's (the sum of its
 * ports). EINVAL: no such port, or `size` smaller than the two header
 * fields. */
int rdmaemu_query_counters(struct ibv_context *context, uint8_t port_num,
			   struct rdmaemu_counters *counters);

/* A QP's counters, since it was created. EINVAL as above. */
int rdmaemu_query_qp_counters(struct ibv_qp *qp, struct rdmaemu_counters *counters);

#ifdef __cplusplus
}
#endif

#endif /* RDMAEMU_RDMAEMU_H */
