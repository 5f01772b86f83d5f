// Multicast groups of cm ids: rdma_join_multicast(_ex) and
// rdma_leave_multicast, as rdma-core 44's librdmacm does them over the
// kernel's CM on a RoCE v2 port (no SA: the join is granted at once, the
// MGID of IPv4 group a.b.c.d is ::ffff:a.b.c.d, LID 0).
//
// The join queues MULTICAST_JOIN; the QP is attached to the group when the
// application reads that event (rdma-core's ucma_process_join), so a failed
// attach turns the event into MULTICAST_ERROR. Each membership counts the
// events taken and acknowledged for it, and a leave waits for those acks,
// since the event's private_data is the join's context.
//
// Thread safety: a membership's `attached` and `left` are guarded by its
// id's mc_mu (held across ibv_attach_mcast/ibv_detach_mcast, so a leave
// and the event's attach never interleave); `reported`/`acked` by the id's
// mu, as the id's own counts.
#pragma once

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <cstdint>

namespace rdmaemu::rdmacm {

struct Event;
struct Id;

struct Membership {
  sockaddr_storage addr{};  // as joined: a leave names it by these bytes
  void* context = nullptr;  // the event's param.ud.private_data
  uint16_t join_flags = 0;  // enum rdma_cm_mc_join_flags
  ibv_gid mgid{};

  bool attached = false;  // id->qp is attached to mgid for it; Id::mc_mu
  bool left = false;      // left, or its id destroyed; Id::mc_mu

  uint32_t reported = 0;  // its events the application took; Id::mu
  uint32_t acked = 0;     // and acknowledged; Id::mu
};

// Inside rdma_get_cm_event, for a MULTICAST_JOIN just taken: attaches
// id->qp to the group (unless the join is send-only, the id has no QP, or
// the membership is gone), and makes the event MULTICAST_ERROR if that
// fails.
void ProcessJoin(Event* event);

// rdma_destroy_qp, before the QP goes: detaches it from every group it is
// attached to. The memberships stay, as the kernel's do.
void DetachAll(Id* id);

// rdma_destroy_id, before it waits for its acks: detaches the QP and ends
// every membership; FreeMemberships then frees them, once no event of
// theirs can be referenced any more.
void LeaveAll(Id* id);
void FreeMemberships(Id* id);

}  // namespace rdmaemu::rdmacm
