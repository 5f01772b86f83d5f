// Helpers shared by the loop tests: a handler built from two functions, and
// a bounded wait.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "emulator/net/loop.h"

namespace rdmaemu::net::testing {

using Clock = std::chrono::steady_clock;

// The tests bind this port (not 4791) on automatic addresses, so they never
// meet a real emulator or each other.
inline constexpr uint16_t kTestPort = 24791;

// A LoopHandler whose behaviour a test sets before Start().
class FnHandler : public LoopHandler {
 public:
  std::function<void(std::span<const Datagram>)> on_datagrams;
  std::function<std::optional<Clock::time_point>(Clock::time_point)> on_work;

  void OnDatagrams(std::span<const Datagram> batch) override {
    if (on_datagrams) on_datagrams(batch);
  }
  std::optional<Clock::time_point> OnWork(Clock::time_point now) override {
    return on_work ? on_work(now) : std::nullopt;
  }
};

// Polls `done` every millisecond until it holds or `limit` passes.
inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto give_up = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline iovec Iov(const void* data, size_t len) { return {const_cast<void*>(data), len}; }

// Keeps every datagram `handler` receives, whole, in arrival order (set
// before Start(); the handler runs on its loop's thread).
class Received {
 public:
  explicit Received(FnHandler& handler) {
    handler.on_datagrams = [this](std::span<const Datagram> batch) {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Datagram& d : batch) got_.emplace_back(d.data.begin(), d.data.end());
    };
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return got_.size();
  }
  std::vector<std::vector<uint8_t>> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<uint8_t>> got_;
};

}  // namespace rdmaemu::net::testing
