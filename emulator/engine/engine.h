// Engine: the device's transport, run on one network loop per open device
// and shared by every context of that device in the process.
//
// Today it carries UD: the requester turns posted sends into UD SEND
// packets, the receive path checks each packet (parse, ICRC, QPN, state,
// Q_Key) and scatters it into a posted receive. RC and UC (requester /
// responder / completer with PSNs, ACKs and retries) are not implemented yet.
//
// Thread safety: AddQp/RemoveQp/Doorbell from any thread; everything else
// on the loop thread.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "emulator/base/status.h"
#include "emulator/device/device.h"
#include "emulator/engine/qp.h"
#include "emulator/net/loop.h"
#include "emulator/wire/packet.h"

namespace rdmaemu::engine {

struct EngineCounters {
  std::atomic<uint64_t> packets_sent{0};
  std::atomic<uint64_t> packets_received{0};
  std::atomic<uint64_t> dropped_malformed{0};
  std::atomic<uint64_t> dropped_icrc{0};
  std::atomic<uint64_t> dropped_unknown_qpn{0};
  std::atomic<uint64_t> dropped_bad_state{0};
  std::atomic<uint64_t> dropped_qkey{0};
  std::atomic<uint64_t> dropped_pkey{0};
  std::atomic<uint64_t> dropped_no_receive{0};
};

class Engine : public net::LoopHandler {
 public:
  // Takes over the device's port-1 socket and starts the loop thread.
  static Result<std::shared_ptr<Engine>> Start(std::shared_ptr<device::Device> device);
  ~Engine() override;

  device::Device& device() { return *device_; }
  net::Backend backend() const { return loop_->backend(); }

  // A fresh QP number (24 bits, never 0 or 1, unique on this device).
  Result<uint32_t> AllocateQpn();
  void AddQp(std::shared_ptr<Qp> qp);
  // After this returns the engine holds no reference to the QP.
  void RemoveQp(uint32_t qpn);
  // Any thread: the QP has new send work.
  void Doorbell(uint32_t qpn);

  const EngineCounters& counters() const { return counters_; }

  // net::LoopHandler
  void OnDatagrams(std::span<const net::Datagram> batch) override;
  std::optional<std::chrono::steady_clock::time_point> OnWork(
      std::chrono::steady_clock::time_point now) override;

 private:
  explicit Engine(std::shared_ptr<device::Device> device);
  std::shared_ptr<Qp> FindQp(uint32_t qpn);
  void ExecuteSends(Qp& qp);
  void ExecuteUdSend(Qp& qp, const SendWqe& wqe);
  void ReceiveUd(Qp& qp, const wire::PacketView& packet, const net::Datagram& dgram);
  // Copies `wqe`'s payload into out (gathering SGEs); false with a status.
  objects::WcStatus Gather(const Qp& qp, const SendWqe& wqe, std::vector<uint8_t>& out);
  void CompleteSend(Qp& qp, const SendWqe& wqe, objects::WcStatus status);

  const std::shared_ptr<device::Device> device_;
  std::unique_ptr<net::Loop> loop_;
  uint32_t local_ip_ = 0;  // host order
  uint16_t udp_port_ = 0;  // host order
  EngineCounters counters_;

  std::shared_mutex qps_mu_;
  std::unordered_map<uint32_t, std::shared_ptr<Qp>> qps_;  // guarded by qps_mu_
  uint32_t next_qpn_ = 0x11;                                // guarded by qps_mu_

  std::mutex pending_mu_;
  std::vector<uint32_t> pending_;  // guarded by pending_mu_: QPs rung since the last OnWork

  std::vector<uint8_t> scratch_;   // loop thread: payload gathering
  std::vector<uint8_t> packet_;    // loop thread: packet building
};

// One engine per open device in the process, shared by its contexts.
Result<std::shared_ptr<Engine>> AcquireEngine(int device_index);

}  // namespace rdmaemu::engine
