/* Mistake: acknowledging an RDMA CM event twice (rdma-core frees the event
 * at the first rdma_ack_cm_event; the second is a use after free, and the
 * id's counts never match again). */
#include "cm_common.h"

int main(void) {
  struct rdma_event_channel *channel = rdma_create_event_channel();
  if (channel == NULL) cm_die("rdma_create_event_channel");
  struct rdma_cm_id *id;
  if (rdma_create_id(channel, &id, NULL, RDMA_PS_TCP)) cm_die("rdma_create_id");
  struct rdma_cm_event *event = cm_resolve(channel, id);
  rdma_ack_cm_event(event);
  if (rdma_ack_cm_event(event) == 0) {
    fprintf(stderr, "the second rdma_ack_cm_event succeeded\n");
    return 3;
  }
  if (rdma_destroy_id(id)) cm_die("rdma_destroy_id");
  rdma_destroy_event_channel(channel);
  return 0;
}
