// The verbs entry points `rdmaemu devices` and `rdmaemu run`'s device probe
// call in a libibverbs.so.1 they loaded with dlopen (the library under
// test, never the one the tool was linked against: it is linked to none).
#pragma once

#include <dlfcn.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <string>

#include "rdmaemu/rdmaemu.h"

namespace rdmaemu::cli {

struct LoadedVerbs {
  decltype(&::ibv_get_device_list) get_device_list = nullptr;
  decltype(&::ibv_free_device_list) free_device_list = nullptr;
  decltype(&::ibv_get_device_name) get_device_name = nullptr;
  decltype(&::ibv_get_device_guid) get_device_guid = nullptr;
  decltype(&::ibv_open_device) open_device = nullptr;
  decltype(&::ibv_close_device) close_device = nullptr;
  decltype(&::ibv_query_device) query_device = nullptr;
  decltype(&::_ibv_query_gid_ex) query_gid_ex = nullptr;
  // The exported ibv_query_port, for a context whose verbs_context lacks the
  // extended op (never ours, but this is what verbs.h's inline does).
  int (*query_port_compat)(ibv_context*, uint8_t, ibv_port_attr*) = nullptr;
  // rdmaemu.h's: whether an address is fixed or picked at open.
  decltype(&::rdmaemu_query_port_address) query_port_address = nullptr;
};

namespace loaded_verbs_internal {
template <typename F>
bool Resolve(void* handle, const char* name, F& out, std::string& missing) {
  void* sym = ::dlsym(handle, name);
  if (sym == nullptr) {
    missing = name;
    return false;
  }
  out = reinterpret_cast<F>(sym);
  return true;
}
}  // namespace loaded_verbs_internal

// Resolves every entry point from `handle`: the name of the first one the
// library does not export, or "" when it has them all.
inline std::string LoadVerbs(void* handle, LoadedVerbs& v) {
  using loaded_verbs_internal::Resolve;
  std::string missing;
  if (!Resolve(handle, "ibv_get_device_list", v.get_device_list, missing) ||
      !Resolve(handle, "ibv_free_device_list", v.free_device_list, missing) ||
      !Resolve(handle, "ibv_get_device_name", v.get_device_name, missing) ||
      !Resolve(handle, "ibv_get_device_guid", v.get_device_guid, missing) ||
      !Resolve(handle, "ibv_open_device", v.open_device, missing) ||
      !Resolve(handle, "ibv_close_device", v.close_device, missing) ||
      !Resolve(handle, "ibv_query_device", v.query_device, missing) ||
      !Resolve(handle, "_ibv_query_gid_ex", v.query_gid_ex, missing) ||
      !Resolve(handle, "ibv_query_port", v.query_port_compat, missing) ||
      !Resolve(handle, "rdmaemu_query_port_address", v.query_port_address, missing)) {
    return missing;
  }
  return "";
}

// What verbs.h's inline ibv_query_port does, through the loaded library.
inline int QueryPort(const LoadedVerbs& v, ibv_context* ctx, uint8_t port, ibv_port_attr* attr) {
  std::memset(attr, 0, sizeof(*attr));
  verbs_context* vctx = verbs_get_ctx_op(ctx, query_port);
  if (vctx == nullptr) return v.query_port_compat(ctx, port, attr);
  return vctx->query_port(ctx, port, attr, sizeof(*attr));
}

}  // namespace rdmaemu::cli
