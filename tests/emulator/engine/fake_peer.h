// Test helpers for protocol tests of the engine's RC transport.
//
// FakePeer is a plain UDP socket on an address the emulator never takes
// (kPeerIp, outside the auto range), bound to the emulator's UDP port: it
// crafts RoCEv2 packets with wire::BuildPacket and a correct ICRC for the
// real addresses, and reads the engine's answers with wire::ParsePacket and
// wire::CheckIcrc.
//
// EmuRc is the emulator side, built only through the public verbs API: a
// device context, a PD, a CQ, registered buffers and RC QPs connected to the
// fake peer.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <chrono>
#include <memory>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "emulator/wire/packet.h"

namespace rdmaemu::testing {

using namespace std::chrono_literals;

// The fake peer's QP number, as the emulator's QPs see it.
inline constexpr uint32_t kPeerQpn = 0xabcd;
// 127.64.0.0 + 2 * pid: on loopback, outside the emulator's auto range
// (127.0.0.1-127.0.3.255), and this process's own. The same test binary may
// run twice at once (another checkout, a sanitizer build): with one shared
// address the second peer's bind stole the first one's packets, and a test
// saw the other process's transmissions as its own early retransmissions.
// kPeerIp + 1 is this process's too, for a second peer.
uint32_t PeerIpOfThisProcess();
inline const uint32_t kPeerIp = PeerIpOfThisProcess();

// One packet the fake peer received, decoded.
struct RxPacket {
  std::vector<uint8_t> bytes;  // the UDP payload as received
  bool icrc_ok = false;
  wire::Opcode opcode{};
  uint32_t psn = 0;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  uint16_t pkey = 0;
  bool has_aeth = false;
  uint8_t syndrome = 0;
  uint32_t msn = 0;
  bool has_reth = false;
  uint64_t reth_va = 0;
  uint32_t reth_rkey = 0;
  uint32_t reth_length = 0;
  bool has_atomic_ack = false;
  uint64_t orig_data = 0;
  std::vector<uint8_t> payload;

  wire::AethType aeth_type() const { return wire::SyndromeType(syndrome); }
  uint8_t aeth_value() const { return wire::SyndromeValue(syndrome); }
};

class FakePeer {
 public:
  // Binds ip:port (host order); emu_ip is the emulator's address (host order).
  FakePeer(uint32_t emu_ip, uint16_t port, uint32_t ip = kPeerIp);
  ~FakePeer();
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;

  bool ok() const { return fd_ >= 0; }
  uint32_t ip() const { return ip_; }

  // Builds the packet (with the right ICRC) and sends it. Returns the bytes sent.
  std::vector<uint8_t> Send(const wire::PacketFields& fields,
                            std::span<const uint8_t> payload = {});
  // Builds without sending (ICRC correct).
  std::vector<uint8_t> Build(const wire::PacketFields& fields,
                             std::span<const uint8_t> payload = {}) const;
  // Sends bytes as they are.
  void SendRaw(std::span<const uint8_t> bytes);
  // Sends packets as one UDP GSO send, so that they reach the emulator's
  // socket together (UDP GRO): every one as long as the first but the last,
  // which may be shorter. False if the kernel refused it.
  bool SendTogether(std::span<const std::vector<uint8_t>> packets);
  // Recomputes the ICRC trailer of `packet` for this peer -> the emulator.
  void FixIcrc(std::span<uint8_t> packet) const;

  // The next well-formed packet, or nullopt after `timeout`. A datagram that
  // does not parse is returned with opcode unset and icrc_ok false.
  std::optional<RxPacket> Receive(std::chrono::milliseconds timeout = 2000ms);
  // Every packet arriving within `window`.
  std::vector<RxPacket> ReceiveAll(std::chrono::milliseconds window);
  // Discards whatever is queued.
  void Drain();

  // Convenience builders for the fake peer as requester / responder.
  static wire::PacketFields Request(wire::Opcode op, uint32_t dest_qpn, uint32_t psn,
                                    bool ack_req = true);
  static wire::PacketFields Ack(uint32_t dest_qpn, uint32_t psn, uint8_t syndrome,
                                uint32_t msn = 0);

 private:
  int fd_ = -1;
  uint32_t ip_;
  uint32_t emu_ip_;
  uint16_t port_;
};

// Parameters of an RC QP connected to the fake peer.
struct RcParams {
  int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ibv_mtu mtu = IBV_MTU_1024;
  uint32_t rq_psn = 100;
  uint32_t sq_psn = 500;
  uint8_t min_rnr_timer = 5;
  uint8_t timeout = 0;  // 0: no transport timer
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t max_rd_atomic = 4;
  uint32_t dest_qpn = kPeerQpn;
  uint32_t peer_ip = kPeerIp;
};

class EmuRc {
 public:
  // Opens device 0. Check ok() after. With `with_channel` the CQ has a
  // completion channel (channel()).
  explicit EmuRc(bool with_channel = false);
  ~EmuRc();
  EmuRc(const EmuRc&) = delete;
  EmuRc& operator=(const EmuRc&) = delete;

  bool ok() const { return pd_ != nullptr && cq_ != nullptr; }
  ibv_context* ctx() { return ctx_; }
  ibv_pd* pd() { return pd_; }
  ibv_cq* cq() { return cq_; }
  ibv_comp_channel* channel() { return channel_; }
  // The emulator's IPv4 address (host order), from GID index 0.
  uint32_t ip() const { return ip_; }
  uint16_t udp_port() const { return port_; }

  // A registered buffer of `bytes`, filled with `fill`.
  struct Buffer {
    std::vector<uint8_t> data;
    ibv_mr* mr = nullptr;
    uint64_t addr() const { return reinterpret_cast<uintptr_t>(data.data()); }
  };
  Buffer* Register(size_t bytes, int access, uint8_t fill = 0);

  // An RC QP in RESET.
  ibv_qp* CreateQp(uint32_t wr = 16);
  int ToInit(ibv_qp* qp, const RcParams& p);
  int ToRtr(ibv_qp* qp, const RcParams& p);
  int ToRts(ibv_qp* qp, const RcParams& p);
  // CreateQp + ToInit + ToRtr + ToRts; nullptr on failure.
  ibv_qp* ConnectedQp(const RcParams& p = {});
  // Two RC QPs of the device connected to each other (the device talks to
  // itself on its own address), in RTS; p's PSNs and peer are replaced: the
  // first sends from PSN 1000, the second from 2000. {nullptr, nullptr} on
  // failure.
  std::pair<ibv_qp*, ibv_qp*> ConnectedPair(RcParams p = {}, uint32_t wr = 64);

  int PostRecv(ibv_qp* qp, uint64_t wr_id, const Buffer& b, size_t offset, size_t length);
  int PostSend(ibv_qp* qp, uint64_t wr_id, ibv_wr_opcode op, const Buffer& b, size_t offset,
               size_t length, uint64_t remote_addr = 0, uint32_t rkey = 0);
  ibv_qp_state State(ibv_qp* qp);

  // The next completion, or nullopt after `timeout`. With `spin` it polls
  // without sleeping between polls, as a program spinning on its CQ does.
  std::optional<ibv_wc> Poll(std::chrono::milliseconds timeout = 2000ms, bool spin = false);
  // Every completion within `window`.
  std::vector<ibv_wc> PollAll(std::chrono::milliseconds window);

 private:
  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  uint32_t ip_ = 0;
  uint16_t port_ = 0;
  std::vector<ibv_qp*> qps_;
  std::vector<std::unique_ptr<Buffer>> buffers_;
};

// The UDP port the emulator uses: RDMAEMU_UDP_PORT, or 4791.
uint16_t EmulatorUdpPort();

}  // namespace rdmaemu::testing
