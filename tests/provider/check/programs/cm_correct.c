/* No mistake: an RDMA CM id resolved, every event acknowledged once, and
 * everything destroyed. */
#include "cm_common.h"

int main(void) {
  struct rdma_event_channel *channel = rdma_create_event_channel();
  if (channel == NULL) cm_die("rdma_create_event_channel");
  struct rdma_cm_id *id;
  if (rdma_create_id(channel, &id, NULL, RDMA_PS_TCP)) cm_die("rdma_create_id");
  rdma_ack_cm_event(cm_resolve(channel, id));
  if (rdma_resolve_route(id, 2000)) cm_die("rdma_resolve_route");
  struct rdma_cm_event *event;
  if (rdma_get_cm_event(channel, &event)) cm_die("rdma_get_cm_event");
  rdma_ack_cm_event(event);
  if (rdma_destroy_id(id)) cm_die("rdma_destroy_id");
  rdma_destroy_event_channel(channel);
  return 0;
}
