// The verbs side of the soak program: one device, one PD, one CQ with a
// completion channel, and the QP state transitions, each failure named.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "tests/e2e/soak/channel.h"
#include "tests/e2e/soak/common.h"

namespace soak {

// What one side tells the other over the control connection.
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t gid[16] = {};
  uint32_t active_mtu = 0;  // enum ibv_mtu
  uint32_t qkey = 0;
  // RC server: the regions the client reaches (read, write, atomics).
  uint64_t read_addr = 0, write_addr = 0, atomic_addr = 0;
  uint32_t read_rkey = 0, write_rkey = 0, atomic_rkey = 0;
};

struct Verbs {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* channel = nullptr;
  ibv_cq* cq = nullptr;  // sends and receives both complete here
  ibv_port_attr port{};
  ibv_gid gid{};
  uint8_t port_num = 1;
  int gid_index = 0;
  uint32_t cq_events = 0;  // taken and acknowledged
};

// Opens the device (the first one, or by name), its PD, a CQ of `cqe`
// entries and the channel. Dies with the failing call named.
Verbs OpenVerbs(const Options& o, int cqe);
void CloseVerbs(Verbs& v);
ibv_mr* Register(Verbs& v, void* addr, size_t len, int access);
ibv_qp* CreateQp(Verbs& v, ibv_qp_type type, const ibv_qp_cap& cap);

// RESET -> INIT -> RTR -> RTS for an RC QP connected to `remote`.
struct RcPath {
  ibv_mtu mtu = IBV_MTU_1024;
  uint8_t timeout = 14;  // 4.096 us * 2^timeout
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;  // forever
  uint8_t rd_atomic = 16;
};
void ConnectRc(Verbs& v, ibv_qp* qp, uint32_t local_psn, const Endpoint& remote, const RcPath& path);
// RESET -> INIT -> RTR -> RTS for a UD QP.
void ReadyUd(Verbs& v, ibv_qp* qp, uint32_t qkey, uint32_t psn);
// An AH for a UD peer (RoCE needs the GRH).
ibv_ah* CreateAh(Verbs& v, const Endpoint& remote);

Endpoint LocalEndpoint(const Verbs& v, const ibv_qp* qp, uint32_t psn);

// Returns between 1 and `max` completions, sleeping on the completion
// channel when there are none. Dies if the peer closes the control
// connection while waiting (it failed), so no side waits forever.
int WaitCompletions(Verbs& v, ibv_wc* wc, int max, Channel& ctl);
// Like WaitCompletions, but returns 0 after `quiet_ms` with no completion.
int WaitCompletionsFor(Verbs& v, ibv_wc* wc, int max, Channel& ctl, int quiet_ms);

const char* MtuName(uint32_t mtu_enum);
uint32_t MtuBytes(ibv_mtu mtu);

}  // namespace soak
