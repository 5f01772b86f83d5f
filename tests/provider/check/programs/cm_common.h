/* Helpers of the RDMA CM mistake programs: the emulated host's address and
 * one event of a resolution. */
#pragma once

#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cm_die(const char *what) {
  perror(what);
  exit(2);
}

/* The address of the first emulated device's port 1. */
static struct sockaddr_in cm_device_address(void) {
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof sin);
  sin.sin_family = AF_INET;
  int n = 0;
  struct ibv_context **list = rdma_get_devices(&n);
  if (list == NULL || n == 0) cm_die("rdma_get_devices");
  union ibv_gid gid;
  if (ibv_query_gid(list[0], 1, 0, &gid)) cm_die("ibv_query_gid");
  memcpy(&sin.sin_addr, &gid.raw[12], 4);
  rdma_free_devices(list);
  return sin;
}

/* Resolves `id` to the host's own address; returns the ADDR_RESOLVED event,
 * not acknowledged. */
static struct rdma_cm_event *cm_resolve(struct rdma_event_channel *channel, struct rdma_cm_id *id) {
  struct sockaddr_in dst = cm_device_address();
  dst.sin_port = htons(7471);
  if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000)) cm_die("rdma_resolve_addr");
  struct rdma_cm_event *event;
  if (rdma_get_cm_event(channel, &event)) cm_die("rdma_get_cm_event");
  if (event->event != RDMA_CM_EVENT_ADDR_RESOLVED) {
    fprintf(stderr, "got %s\n", rdma_event_str(event->event));
    exit(2);
  }
  return event;
}
