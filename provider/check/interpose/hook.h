// What the preloaded interposer (librdmaemu_interpose.so, interpose.cc) and
// libibverbs.so.1 agree on, for freed-registered-memory.
//
// The interposer is preloaded, so it is in the process from the first
// instruction, while libibverbs.so.1 may come later (dlopen'ed by a Python
// module, RTLD_LOCAL) or never. So the library finds the interposer, not the
// other way round: when the checker is on and the first MR is registered,
// it looks up kAttachSymbol in the global scope and hands over a hook; the
// interposer forwards to the real functions and asks nothing until then.
#pragma once

#include <atomic>
#include <cstddef>

namespace rdmaemu::check {

struct FreeHook {
  // MRs registered now. Read before anything else on every free, so that a
  // program with no MR pays one load.
  const std::atomic<unsigned>* live;
  // [addr, addr + length) is about to be released by `verb` ("free",
  // "realloc", "munmap"). Called on the releasing thread, before the memory
  // goes back; never called again on a thread already inside it.
  void (*released)(const void* addr, size_t length, const char* verb);
};

// The file rdmaemu run preloads, beside libibverbs.so.1 (tools/rdmaemu/run.cc
// spells the same name).
inline constexpr const char* kInterposerName = "librdmaemu_interpose.so";

// extern "C" void rdmaemu_interpose_attach(const FreeHook* hook): NULL
// detaches (the library is unloading).
inline constexpr const char* kAttachSymbol = "rdmaemu_interpose_attach";
using AttachFn = void (*)(const FreeHook*);

}  // namespace rdmaemu::check
