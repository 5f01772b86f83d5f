// Device, port, GID and P_Key queries.
#include <arpa/inet.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "emulator/base/log.h"
#include "provider/provider.h"
#include "verbs/core/library.h"

using namespace rdmaemu;
using namespace rdmaemu::verbs;

extern "C" {

#undef ibv_query_port

int ibv_query_device(ibv_context* context, ibv_device_attr* device_attr) {
  // Writes exactly sizeof(struct ibv_device_attr): the caller's struct may
  // be the 1.1 one, with nothing after it.
  ibv_device_attr_ex* ex = reinterpret_cast<ibv_device_attr_ex*>(device_attr);
  return ToVerbsContext(context)->query_device_ex(context, nullptr, ex, sizeof(ibv_device_attr));
}

int ibv_query_port(ibv_context* context, uint8_t port_num, _compat_ibv_port_attr* port_attr) {
  // The exported symbol writes only the 48-byte struct of older programs
  // (struct _compat_ibv_port_attr: everything before port_cap_flags2).
  return ToVerbsContext(context)->query_port(context, port_num,
                                             reinterpret_cast<ibv_port_attr*>(port_attr),
                                             offsetof(ibv_port_attr, port_cap_flags2));
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  ibv_gid_entry entry;
  int rc = index < 0 ? EINVAL : provider::QueryGidEntry(context, port_num, index, &entry);
  if (rc == ENODATA) {
    // An empty slot is a zero GID, as rdma-core answers.
    std::memset(gid, 0, sizeof *gid);
    return 0;
  }
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  *gid = entry.gid;
  return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  if (flags != 0) return EINVAL;
  if (entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  return provider::QueryGidEntry(context, port_num, gid_index, entry);
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
  if (flags != 0 || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  ibv_device_attr attr;
  if (int rc = ibv_query_device(context, &attr); rc != 0) return -rc;
  // Like the kernel, refuse a buffer too small for every valid entry.
  ssize_t n = 0;
  for (uint32_t port = 1; port <= attr.phys_port_cnt; ++port) {
    int len = provider::QueryGidTableLength(context, port);
    if (len < 0) return len;
    for (int i = 0; i < len; ++i) {
      ibv_gid_entry entry;
      int rc = provider::QueryGidEntry(context, port, static_cast<uint32_t>(i), &entry);
      if (rc == ENODATA) continue;
      if (rc != 0) return -rc;
      if (static_cast<size_t>(n) >= max_entries) return -EINVAL;
      std::memcpy(reinterpret_cast<char*>(entries) + n * entry_size, &entry, sizeof entry);
      ++n;
    }
  }
  return n;
}

// enum ibv_gid_type_sysfs from rdma-core's driver.h: IB_ROCE_V1 = 0, ROCE_V2 = 1.
int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                       unsigned int* type) {
  ibv_gid_entry entry;
  int rc = provider::QueryGidEntry(context, port_num, index, &entry);
  if (rc == ENODATA) {
    *type = 0;
    return 0;
  }
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  *type = entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  uint16_t value;
  int rc = provider::QueryPkey(context, port_num, index, &value);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  *pkey = value;
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  for (int i = 0;; ++i) {
    __be16 value;
    int rc = ibv_query_pkey(context, port_num, i, &value);
    if (rc < 0) return rc;
    if (value == pkey) return i;
  }
}

}  // extern "C"
