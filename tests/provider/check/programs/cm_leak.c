/* Mistake: exiting with an rdma_cm_id and its event channel never destroyed.
 * (The context and PD librdmacm opened for the device are the library's:
 * no report names them.) */
#include "cm_common.h"

int main(void) {
  struct rdma_event_channel *channel = rdma_create_event_channel();
  if (channel == NULL) cm_die("rdma_create_event_channel");
  struct rdma_cm_id *id;
  if (rdma_create_id(channel, &id, NULL, RDMA_PS_TCP)) cm_die("rdma_create_id");
  rdma_ack_cm_event(cm_resolve(channel, id));
  return 0;
}
