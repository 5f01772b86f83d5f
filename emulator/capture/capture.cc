#include "emulator/capture/capture.h"

#include <cstdlib>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "emulator/base/log.h"

namespace rdmaemu::capture {
namespace internal {
std::atomic<bool> active{false};
}  // namespace internal

namespace {

// Leaked: engines may record while static destructors run at exit.
std::mutex& Mu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unique_ptr<PcapWriter>& Writer() {  // guarded by Mu()
  static auto* w = new std::unique_ptr<PcapWriter>;
  return *w;
}

}  // namespace

void internal::Record(const Endpoints& e, std::span<const uint8_t> udp_payload) {
  std::lock_guard lock(Mu());
  if (Writer()) Writer()->Record(e, udp_payload);
}

Status StartFromEnvironment() {
  static const Status status = [] {
    const char* v = std::getenv("RDMAEMU_PCAP");
    if (v == nullptr || *v == '\0') return Status::Ok();
    Status s = Start(v);
    if (!s.ok()) return Status::Error(s.code(), fmt::format("RDMAEMU_PCAP: {}", s.message()));
    return s;
  }();
  return status;
}

Status Start(std::string_view pattern) {
  std::lock_guard lock(Mu());
  if (Writer()) {
    return Busy(fmt::format("a capture into '{}' is running; stop it first", Writer()->path()));
  }
  auto w = PcapWriter::Open(pattern);
  if (!w.ok()) return w.status();
  Writer() = std::move(w).value();
  internal::active.store(true, std::memory_order_relaxed);
  Log().info("capturing every packet into '{}'", Writer()->path());
  return Status::Ok();
}

Result<Stopped> Stop() {
  std::unique_ptr<PcapWriter> w;
  {
    std::lock_guard lock(Mu());
    if (!Writer()) return NotFound("no capture is running");
    internal::active.store(false, std::memory_order_relaxed);
    w = std::move(Writer());
  }
  Stopped out{w->path(), w->packets()};
  Status s = w->Flush();
  w.reset();
  if (!s.ok()) return s;
  Log().info("capture stopped: {} packets in '{}'", out.packets, out.path);
  return out;
}

std::string CurrentPath() {
  std::lock_guard lock(Mu());
  return Writer() ? Writer()->path() : std::string();
}

std::optional<Summary> Running() {
  std::lock_guard lock(Mu());
  if (!Writer()) return std::nullopt;
  return Summary{Writer()->path(), Writer()->packets()};
}

bool FlushIfDue(std::chrono::steady_clock::time_point now) {
  if (!Active()) return false;
  std::lock_guard lock(Mu());
  if (!Writer()) return false;
  if (Writer()->FlushDue(now)) (void)Writer()->Flush();
  return Writer()->HasPending();
}

void Flush() {
  std::lock_guard lock(Mu());
  if (Writer()) (void)Writer()->Flush();
}

}  // namespace rdmaemu::capture
