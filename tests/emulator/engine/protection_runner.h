// The protection boundary, model-checked (issue 16, item 2): random memory
// regions and windows (addresses, lengths, rights, PDs, IOVAs; registered,
// re-registered, deregistered, bound, invalidated, deallocated) and random
// remote requests from a fake peer (opcode, rkey, address, length, PSN)
// against the emulator, each checked against protection_model.h: the
// answer on the wire, the receive completion, and every byte of the memory
// the test owns (the regions' pages with the bytes around them, inside
// PROT_NONE guard pages).
//
// Everything random comes from one seed: a failure names the seed and the
// case, and RDMAEMU_MODEL_SEED=<seed> runs the same cases again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace rdmaemu::testing {

struct ProtectionRunStats {
  uint64_t cases = 0;
  // "READ -> NAK_REMOTE_ACCESS", "bind type 2 -> ok", ...: how often each.
  std::map<std::string, uint64_t> outcomes;
};

class ProtectionRunner {
 public:
  explicit ProtectionRunner(uint64_t seed);
  ~ProtectionRunner();
  ProtectionRunner(const ProtectionRunner&) = delete;
  ProtectionRunner& operator=(const ProtectionRunner&) = delete;

  // Empty when the device, the fake peer and the QPs are ready.
  const std::string& setup_error() const;
  // Runs `cases` more cases; false at the first disagreement with the
  // model, and failure() says which, with the steps before it.
  bool Run(uint64_t cases);
  const std::string& failure() const;
  const ProtectionRunStats& stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rdmaemu::testing
