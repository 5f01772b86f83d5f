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

#ifdef __cplusplus
}
#endif

#endif /* RDMAEMU_RDMAEMU_H */
