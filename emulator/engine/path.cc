// Automatic path migration (IBA 17.2.8): an RC or UC QP may hold an
// alternate path (another port and destination) beside its current one.
// Loaded with IBV_MIG_REARM, it becomes ARMED once the peer is rearmed too:
// each side then sends packets with the BTH MigReq bit clear, and a QP in
// REARM that receives such a packet on its current path arms itself.
//
// When the current path fails while ARMED, the requester migrates: the
// alternate path becomes the current one (the old current path is kept as
// the alternate, so the application may rearm it once repaired), the QP
// reports IBV_EVENT_PATH_MIG and sends from then on with MigReq set. The
// responder migrates when a request with MigReq set arrives on its
// alternate path while ARMED, and reports PATH_MIG too.
//
// "The current path fails" means, for this device: its port is DOWN
// (rdmaemu_set_port_state, `rdmaemu port DEV N down`) - the requester then
// migrates before its next packet - or the transport retries run out on it
// (IBA 9.7.6.1.3 leaves the choice of the trigger to the channel adapter;
// retries exhausted is the one every path failure ends in). When migration
// is needed but not possible (not ARMED, or the alternate port is down too)
// the QP reports IBV_EVENT_PATH_MIG_ERR if it had an alternate path, and
// then fails as any QP does when its retries run out: RETRY_EXC_ERR.
#include <fmt/format.h>

#include "emulator/base/log.h"
#include "emulator/engine/engine.h"
#include "emulator/engine/internal.h"
#include "emulator/wire/psn.h"

namespace rdmaemu::engine {

bool Engine::Migrate(Qp& qp, std::string_view why) {
  TransportAttrs& t = qp.attrs;
  if (t.mig_state != MigState::kArmed || t.alt_port == 0 || !device_->PortUp(t.alt_port)) return false;
  const uint8_t from = t.port;
  SwapPaths(t);
  t.mig_state = MigState::kMigrated;
  ++qp.migrations;
  Log().info("{} qp#{}: migrated from port {} to its alternate path on port {} ({})",
             device_->name(), qp.qpn, from, t.port, why);
  RaiseQpEvent(qp, device::AsyncEventType::kPathMig);
  return true;
}

void Engine::MigrateIfPortDown(Qp& qp) {
  if (qp.attrs.mig_state != MigState::kArmed || device_->PortUp(qp.attrs.port)) return;
  if (!Migrate(qp, fmt::format("port {} is down", qp.attrs.port))) return;
  RestartOnNewPath(qp);
}

bool Engine::MigrateOnRetriesExhausted(Qp& qp) {
  if (Migrate(qp, fmt::format("{} retries ran out on port {}", qp.attrs.retry_cnt, qp.attrs.port))) {
    RestartOnNewPath(qp);
    return true;
  }
  if (qp.attrs.alt_port != 0) {
    Log().warn("{} qp#{}: the path on port {} failed and the QP cannot migrate: {}", device_->name(),
               qp.qpn, qp.attrs.port,
               qp.attrs.mig_state != MigState::kArmed
                   ? fmt::format("its path migration state is {} (IBV_MIG_ARMED is needed)",
                                 qp.attrs.mig_state == MigState::kRearm ? "REARM" : "MIGRATED")
                   : fmt::format("the alternate port {} is down", qp.attrs.alt_port));
    RaiseQpEvent(qp, device::AsyncEventType::kPathMigErr);
  }
  return false;
}

void Engine::RestartOnNewPath(Qp& qp) {
  qp.retries_left = qp.attrs.retry_cnt;
  if (IsReliable(qp.type) && !qp.inflight.empty()) {
    qp.timeouts_in_row = 0;  // a new path: no backoff carried over
    RetransmitFrom(qp, qp.inflight.front().first_psn);
  }
}

bool Engine::AcceptPath(Qp& qp, const wire::PacketView& packet, uint32_t src_ip, uint8_t port) {
  TransportAttrs& t = qp.attrs;
  if (src_ip == t.dest_ip && port == t.port) {
    if (t.mig_state == MigState::kRearm && !packet.bth().migreq()) {
      t.mig_state = MigState::kArmed;
      Log().debug("{} qp#{}: the peer is rearmed too: path migration ARMED (alternate port {})",
                  device_->name(), qp.qpn, t.alt_port);
    }
    return true;
  }
  const bool on_alternate = t.alt_port != 0 && src_ip == t.alt_dest_ip && port == t.alt_port;
  if (!on_alternate || t.mig_state != MigState::kArmed || !packet.bth().migreq() ||
      !packet.Has(wire::kRequestMask)) {
    return false;
  }
  return Migrate(qp, "the peer migrated: a request with MigReq arrived on the alternate path");
}

}  // namespace rdmaemu::engine
