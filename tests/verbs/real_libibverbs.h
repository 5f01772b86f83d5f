// Access to Debian's rdma-core 44 libibverbs.so.1, for tests that compare our
// implementation with the real one value for value. The real library is
// dlopen'ed privately (RTLD_LOCAL) by absolute path and never linked; tests
// skip the comparison when it is not installed.
#pragma once

#include <dlfcn.h>

namespace rdmaemu::testing {

inline constexpr const char* kRealLibibverbs = "/usr/lib/x86_64-linux-gnu/libibverbs.so.1";

// The real library's handle, or nullptr if it cannot be loaded.
inline void* RealLibibverbs() {
  static void* handle = dlopen(kRealLibibverbs, RTLD_NOW | RTLD_LOCAL);
  return handle;
}

// The real library's definition of `name` with the type of `ours` (pass our
// function, e.g. RealSymbol(ibv_wc_status_str, "ibv_wc_status_str")), or
// nullptr.
template <typename F>
F* RealSymbol(F* ours, const char* name) {
  (void)ours;
  void* handle = RealLibibverbs();
  if (handle == nullptr) return nullptr;
  return reinterpret_cast<F*>(dlsym(handle, name));
}

}  // namespace rdmaemu::testing

// Looks up the real library's definition of the function `fn`.
#define REAL_SYMBOL(fn) ::rdmaemu::testing::RealSymbol(fn, #fn)
