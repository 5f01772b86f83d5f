// librdmacm's internal declarations shared by its modules: the library's
// one-time initialisation, the failure convention, and the small helpers
// every module uses. The objects themselves are declared in channel.h
// (event channels and events), id.h (cm ids) and address.h (devices).
//
// The split is rdma-core's: this library owns rdma_cm_id, event channels,
// events and their acknowledgement, address and route resolution and every
// QP transition; the device (emulator/cm, reached through the rdmaemu_cm_*
// commands of emulator/cm/uapi.h that libibverbs.so.1 exports) owns the
// connection on the wire, as the kernel's ucma and ib_cm do below
// rdma-core's librdmacm.
#pragma once

#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "emulator/base/log.h"

namespace rdmaemu::rdmacm {

// Sets errno and returns -1: the failure convention of every rdma_* call.
inline int Fail(int error) {
  errno = error;
  return -1;
}

// Sets errno and returns NULL: pointer-returning calls.
template <typename T>
T* FailNull(int error) {
  errno = error;
  return nullptr;
}

// The device's commands return an errno value (0 on success): this turns
// one into rdma-core's convention.
inline int FromDevice(int error) { return error == 0 ? 0 : Fail(error); }

// Runs once per process (rdmaemu_cm_init with the library's deliver
// function, and the device list). Returns 0, or an errno value that every
// call then fails with (ENODEV when there is no device at all).
int Init();

// The defaults the kernel's CM picks on RoCE.
inline constexpr uint8_t kDefaultAckTimeout = 19;    // CMA_IBOE_PACKET_LIFETIME + 1
inline constexpr uint8_t kPacketLifeTime = 18;       // CMA_IBOE_PACKET_LIFETIME
inline constexpr uint8_t kHopLimit = 64;
inline constexpr uint8_t kMaxRetry = 7;

// Private data a user may put in each message (research note §2.5).
inline constexpr uint8_t kReqPrivateData = 56;
inline constexpr uint8_t kSidrReqPrivateData = 180;
inline constexpr uint8_t kRepPrivateData = 196;
inline constexpr uint8_t kRejPrivateData = 148;
inline constexpr uint8_t kSidrRepPrivateData = 136;

// ::ffff:a.b.c.d, the GID of an emulated port whose address is a.b.c.d.
inline ibv_gid MappedGid(in_addr addr) {
  ibv_gid gid{};
  gid.raw[10] = 0xff;
  gid.raw[11] = 0xff;
  __builtin_memcpy(&gid.raw[12], &addr.s_addr, 4);
  return gid;
}

// a.b.c.d of an IPv4-mapped GID; false for any other GID.
inline bool GidToAddress(const ibv_gid& gid, in_addr* addr) {
  for (int i = 0; i < 10; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  if (gid.raw[10] != 0xff || gid.raw[11] != 0xff) return false;
  __builtin_memcpy(&addr->s_addr, &gid.raw[12], 4);
  return true;
}

inline bool IsLoopback(in_addr addr) { return (ntohl(addr.s_addr) >> 24) == 127; }

// "a.b.c.d" or "a.b.c.d:port" for log lines.
std::string AddressString(in_addr addr);
std::string AddressString(const sockaddr_in& addr);

}  // namespace rdmaemu::rdmacm
