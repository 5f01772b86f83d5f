// The quarantine: a bounded FIFO of destroyed objects' memory.
#include "provider/check/quarantine.h"

#include <deque>
#include <mutex>
#include <utility>

namespace rdmaemu::check {
namespace {

std::mutex g_mu;
// Never freed: objects are disposed of during exit too.
auto& g_fifo = *new std::deque<std::pair<void*, void (*)(void*)>>();  // guarded by g_mu

}  // namespace

void Quarantine(void* memory, void (*release)(void*)) {
  std::pair<void*, void (*)(void*)> oldest{nullptr, nullptr};
  {
    std::lock_guard lock(g_mu);
    g_fifo.emplace_back(memory, release);
    if (g_fifo.size() <= static_cast<size_t>(kQuarantineObjects)) return;
    oldest = g_fifo.front();
    g_fifo.pop_front();
  }
  oldest.second(oldest.first);
}

}  // namespace rdmaemu::check
