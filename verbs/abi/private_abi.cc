// IBVERBS_PRIVATE_34: the interface between rdma-core's libibverbs and its
// hardware providers (libmlx5, libefa, ...).
//
// rdmaemu has no hardware providers: its one provider is built in. These
// symbols exist only because Debian's libmlx5.so.1 and libefa.so.1 import
// them with BIND_NOW, and perftest and pyverbs link those libraries; without
// the symbols such programs die with "symbol lookup error" before main.
//
// Nothing here can legitimately be reached: a provider's context is only ever
// created by libibverbs for a device of that provider, and we never hand a
// hardware provider a device. If something calls one anyway, it fails the way
// the real function reports failure (an errno value, a negative value, or NULL
// with errno set), logs one warning, and touches none of its arguments beyond
// what the failure convention requires.
//
// ibv_query_gid_type is also in this node but is real device logic (ibv_devinfo
// and pyverbs call it): verbs/core implements it.

#include <errno.h>

#include <cstdarg>
#include <cstdio>

#include "emulator/base/log.h"
#include "verbs/abi/exports.h"
#include "verbs/abi/warn_once.h"

namespace {

// The head of rdma-core's struct verbs_device_ops, which is frozen for
// IBVERBS_PRIVATE_34 (a layout change renames the version node): its first
// member is the provider's name.
struct VerbsDeviceOpsHead {
  const char* name;
};

#define RDMAEMU_PRIVATE_ABI_CALLED(name) \
  RDMAEMU_WARN_ONCE("{} called: hardware provider entry points are not supported by rdmaemu", name)

// For ibv_cmd_* / execute_ioctl, which return 0 or an errno value.
#define FAIL_ERRNO_VALUE(name)      \
  do {                              \
    RDMAEMU_PRIVATE_ABI_CALLED(name); \
    return EOPNOTSUPP;              \
  } while (0)

}  // namespace

extern "C" {

// A 1-byte bool data object: libmlx5 reads it to decide whether destroy may
// succeed on a disassociated device. Never true here: we have no such devices.
bool verbs_allow_disassociate_destroy = false;

// Called from the ELF constructor of every hardware provider library as soon
// as it is loaded (perftest start, `import pyverbs.providers.mlx5...`), before
// main and before any ibv_* call, so it must work with nothing initialised.
// The provider is ignored: it never becomes a device.
void verbs_register_driver_34(const struct verbs_device_ops* ops) {
  const char* name = nullptr;
  if (ops != nullptr) name = reinterpret_cast<const VerbsDeviceOpsHead*>(ops)->name;
  rdmaemu::Log().debug("ignoring hardware provider '{}': rdmaemu only offers emulated devices",
                       name != nullptr ? name : "?");
}

// The providers' logging hook (verbs_err/verbs_warn/verbs_debug macros).
// Levels as in driver.h: 1 error, 2 warn, 3 info, 4 debug.
void __verbs_log(struct verbs_context* ctx, uint32_t level, const char* fmt, ...) {
  const int saved_errno = errno;
  if (fmt != nullptr) {
    char line[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(line, sizeof(line), fmt, args);
    va_end(args);
    switch (level) {
      case 0:
        break;
      case 1:
        rdmaemu::Log().error("provider: {}", line);
        break;
      case 2:
        rdmaemu::Log().warn("provider: {}", line);
        break;
      case 3:
        rdmaemu::Log().info("provider: {}", line);
        break;
      default:
        rdmaemu::Log().debug("provider: {}", line);
        break;
    }
  }
  errno = saved_errno;
}

void* _verbs_init_and_alloc_context(struct ibv_device* device, int cmd_fd, size_t alloc_size,
                                    struct verbs_context* context_offset, uint32_t driver_id) {
  RDMAEMU_PRIVATE_ABI_CALLED("_verbs_init_and_alloc_context");
  errno = EOPNOTSUPP;
  return nullptr;
}

struct ibv_context* verbs_open_device(struct ibv_device* device, void* private_data) {
  RDMAEMU_PRIVATE_ABI_CALLED("verbs_open_device");
  errno = EOPNOTSUPP;
  return nullptr;
}

// The void functions below cannot report failure; since no provider context
// can exist, there is nothing for them to do.
void verbs_uninit_context(struct verbs_context* context) {
  RDMAEMU_PRIVATE_ABI_CALLED("verbs_uninit_context");
}

void verbs_set_ops(struct verbs_context* vctx, const struct verbs_context_ops* ops) {
  RDMAEMU_PRIVATE_ABI_CALLED("verbs_set_ops");
}

void verbs_init_cq(struct ibv_cq* cq, struct ibv_context* context,
                   struct ibv_comp_channel* channel, void* cq_context) {
  RDMAEMU_PRIVATE_ABI_CALLED("verbs_init_cq");
}

// Like ibv_read_sysfs_file: the number of bytes read, or -1 with errno set.
int ibv_read_ibdev_sysfs_file(char* buf, size_t size, struct verbs_sysfs_dev* sysfs_dev,
                              const char* fnfmt, ...) {
  RDMAEMU_PRIVATE_ABI_CALLED("ibv_read_ibdev_sysfs_file");
  errno = EOPNOTSUPP;
  return -1;
}

int execute_ioctl(struct ibv_context* context, struct ibv_command_buffer* cmd) {
  FAIL_ERRNO_VALUE("execute_ioctl");
}

// Sizes a provider's on-stack command buffer: the attributes of this buffer
// plus those of the linked ones. The linked buffers are only ever copied by
// execute_ioctl, which fails above, so the buffer's own count is always enough
// (and we need not read a struct whose layout no installed header defines).
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, struct ibv_command_buffer* link) {
  return num_attrs;
}

int ibv_cmd_get_context(struct verbs_context* context, struct ibv_get_context* cmd,
                        size_t cmd_size, struct ib_uverbs_get_context_resp* resp,
                        size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_get_context");
}

int ibv_cmd_query_context(struct ibv_context* ctx, struct ibv_command_buffer* driver) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_context");
}

int ibv_cmd_query_device_any(struct ibv_context* context,
                             const struct ibv_query_device_ex_input* input,
                             struct ibv_device_attr_ex* attr, size_t attr_size,
                             struct ib_uverbs_ex_query_device_resp* resp, size_t* resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_device_any");
}

int ibv_cmd_query_port(struct ibv_context* context, uint8_t port_num,
                       struct ibv_port_attr* port_attr, struct ibv_query_port* cmd,
                       size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_port");
}

int ibv_cmd_alloc_pd(struct ibv_context* context, struct ibv_pd* pd, struct ibv_alloc_pd* cmd,
                     size_t cmd_size, struct ib_uverbs_alloc_pd_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_alloc_pd");
}

int ibv_cmd_dealloc_pd(struct ibv_pd* pd) { FAIL_ERRNO_VALUE("ibv_cmd_dealloc_pd"); }

int ibv_cmd_open_xrcd(struct ibv_context* context, struct verbs_xrcd* xrcd, int vxrcd_size,
                      struct ibv_xrcd_init_attr* attr, struct ibv_open_xrcd* cmd, size_t cmd_size,
                      struct ib_uverbs_open_xrcd_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_open_xrcd");
}

int ibv_cmd_close_xrcd(struct verbs_xrcd* xrcd) { FAIL_ERRNO_VALUE("ibv_cmd_close_xrcd"); }

int ibv_cmd_reg_mr(struct ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access,
                   struct verbs_mr* vmr, struct ibv_reg_mr* cmd, size_t cmd_size,
                   struct ib_uverbs_reg_mr_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_reg_mr");
}

int ibv_cmd_rereg_mr(struct verbs_mr* vmr, uint32_t flags, void* addr, size_t length,
                     uint64_t hca_va, int access, struct ibv_pd* pd, struct ibv_rereg_mr* cmd,
                     size_t cmd_sz, struct ib_uverbs_rereg_mr_resp* resp, size_t resp_sz) {
  FAIL_ERRNO_VALUE("ibv_cmd_rereg_mr");
}

int ibv_cmd_dereg_mr(struct verbs_mr* vmr) { FAIL_ERRNO_VALUE("ibv_cmd_dereg_mr"); }

int ibv_cmd_query_mr(struct ibv_pd* pd, struct verbs_mr* vmr, uint32_t mr_handle) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_mr");
}

int ibv_cmd_advise_mr(struct ibv_pd* pd, enum ibv_advise_mr_advice advice, uint32_t flags,
                      struct ibv_sge* sg_list, uint32_t num_sge) {
  FAIL_ERRNO_VALUE("ibv_cmd_advise_mr");
}

int ibv_cmd_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                          int fd, int access, struct verbs_mr* vmr) {
  FAIL_ERRNO_VALUE("ibv_cmd_reg_dmabuf_mr");
}

int ibv_cmd_alloc_mw(struct ibv_pd* pd, enum ibv_mw_type type, struct ibv_mw* mw,
                     struct ibv_alloc_mw* cmd, size_t cmd_size,
                     struct ib_uverbs_alloc_mw_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_alloc_mw");
}

int ibv_cmd_dealloc_mw(struct ibv_mw* mw) { FAIL_ERRNO_VALUE("ibv_cmd_dealloc_mw"); }

int ibv_cmd_create_cq(struct ibv_context* context, int cqe, struct ibv_comp_channel* channel,
                      int comp_vector, struct ibv_cq* cq, struct ibv_create_cq* cmd,
                      size_t cmd_size, struct ib_uverbs_create_cq_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_cq");
}

int ibv_cmd_create_cq_ex(struct ibv_context* context, const struct ibv_cq_init_attr_ex* cq_attr,
                         struct verbs_cq* cq, struct ibv_create_cq_ex* cmd, size_t cmd_size,
                         struct ib_uverbs_ex_create_cq_resp* resp, size_t resp_size,
                         uint32_t cmd_flags) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_cq_ex");
}

// Polling returns a count, so failure is negative (the real one returns -1).
int ibv_cmd_poll_cq(struct ibv_cq* cq, int ne, struct ibv_wc* wc) {
  RDMAEMU_PRIVATE_ABI_CALLED("ibv_cmd_poll_cq");
  errno = EOPNOTSUPP;
  return -EOPNOTSUPP;
}

int ibv_cmd_req_notify_cq(struct ibv_cq* cq, int solicited_only) {
  FAIL_ERRNO_VALUE("ibv_cmd_req_notify_cq");
}

int ibv_cmd_resize_cq(struct ibv_cq* cq, int cqe, struct ibv_resize_cq* cmd, size_t cmd_size,
                      struct ib_uverbs_resize_cq_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_resize_cq");
}

int ibv_cmd_destroy_cq(struct ibv_cq* cq) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_cq"); }

int ibv_cmd_modify_cq(struct ibv_cq* cq, struct ibv_modify_cq_attr* attr,
                      struct ibv_modify_cq* cmd, size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_cq");
}

int ibv_cmd_create_srq(struct ibv_pd* pd, struct ibv_srq* srq, struct ibv_srq_init_attr* attr,
                       struct ibv_create_srq* cmd, size_t cmd_size,
                       struct ib_uverbs_create_srq_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_srq");
}

int ibv_cmd_create_srq_ex(struct ibv_context* context, struct verbs_srq* srq,
                          struct ibv_srq_init_attr_ex* attr_ex, struct ibv_create_xsrq* cmd,
                          size_t cmd_size, struct ib_uverbs_create_srq_resp* resp,
                          size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_srq_ex");
}

int ibv_cmd_modify_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr, int srq_attr_mask,
                       struct ibv_modify_srq* cmd, size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_srq");
}

int ibv_cmd_query_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr,
                      struct ibv_query_srq* cmd, size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_srq");
}

int ibv_cmd_destroy_srq(struct ibv_srq* srq) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_srq"); }

int ibv_cmd_create_qp(struct ibv_pd* pd, struct ibv_qp* qp, struct ibv_qp_init_attr* attr,
                      struct ibv_create_qp* cmd, size_t cmd_size,
                      struct ib_uverbs_create_qp_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_qp");
}

int ibv_cmd_create_qp_ex(struct ibv_context* context, struct verbs_qp* qp,
                         struct ibv_qp_init_attr_ex* attr_ex, struct ibv_create_qp* cmd,
                         size_t cmd_size, struct ib_uverbs_create_qp_resp* resp,
                         size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_qp_ex");
}

int ibv_cmd_create_qp_ex2(struct ibv_context* context, struct verbs_qp* qp,
                          struct ibv_qp_init_attr_ex* qp_attr, struct ibv_create_qp_ex* cmd,
                          size_t cmd_size, struct ib_uverbs_ex_create_qp_resp* resp,
                          size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_qp_ex2");
}

int ibv_cmd_open_qp(struct ibv_context* context, struct verbs_qp* qp, int vqp_sz,
                    struct ibv_qp_open_attr* attr, struct ibv_open_qp* cmd, size_t cmd_size,
                    struct ib_uverbs_create_qp_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_open_qp");
}

int ibv_cmd_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* qp_attr, int attr_mask,
                     struct ibv_qp_init_attr* qp_init_attr, struct ibv_query_qp* cmd,
                     size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_query_qp");
}

int ibv_cmd_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                      struct ibv_modify_qp* cmd, size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_qp");
}

int ibv_cmd_modify_qp_ex(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                         struct ibv_modify_qp_ex* cmd, size_t cmd_size,
                         struct ib_uverbs_ex_modify_qp_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_qp_ex");
}

int ibv_cmd_destroy_qp(struct ibv_qp* qp) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_qp"); }

// The post verbs return an errno value and point *bad_wr at the first WR not
// posted: here, the first one.
int ibv_cmd_post_send(struct ibv_qp* ibqp, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  FAIL_ERRNO_VALUE("ibv_cmd_post_send");
}

int ibv_cmd_post_recv(struct ibv_qp* ibqp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  FAIL_ERRNO_VALUE("ibv_cmd_post_recv");
}

int ibv_cmd_post_srq_recv(struct ibv_srq* srq, struct ibv_recv_wr* wr,
                          struct ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  FAIL_ERRNO_VALUE("ibv_cmd_post_srq_recv");
}

int ibv_cmd_create_ah(struct ibv_pd* pd, struct ibv_ah* ah, struct ibv_ah_attr* attr,
                      struct ib_uverbs_create_ah_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_ah");
}

int ibv_cmd_destroy_ah(struct ibv_ah* ah) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_ah"); }

int ibv_cmd_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  FAIL_ERRNO_VALUE("ibv_cmd_attach_mcast");
}

int ibv_cmd_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  FAIL_ERRNO_VALUE("ibv_cmd_detach_mcast");
}

int ibv_cmd_create_flow(struct ibv_qp* qp, struct ibv_flow* flow_id,
                        struct ibv_flow_attr* flow_attr, void* ucmd, size_t ucmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_flow");
}

int ibv_cmd_destroy_flow(struct ibv_flow* flow_id) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_flow"); }

int ibv_cmd_create_flow_action_esp(struct ibv_context* ctx, struct ibv_flow_action_esp_attr* attr,
                                   struct verbs_flow_action* flow_action,
                                   struct ibv_command_buffer* driver) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_flow_action_esp");
}

int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action* flow_action,
                                   struct ibv_flow_action_esp_attr* attr,
                                   struct ibv_command_buffer* driver) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_flow_action_esp");
}

int ibv_cmd_destroy_flow_action(struct verbs_flow_action* action) {
  FAIL_ERRNO_VALUE("ibv_cmd_destroy_flow_action");
}

int ibv_cmd_create_wq(struct ibv_context* context, struct ibv_wq_init_attr* wq_init_attr,
                      struct ibv_wq* wq, struct ibv_create_wq* cmd, size_t cmd_size,
                      struct ib_uverbs_ex_create_wq_resp* resp, size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_wq");
}

int ibv_cmd_modify_wq(struct ibv_wq* wq, struct ibv_wq_attr* attr, struct ibv_modify_wq* cmd,
                      size_t cmd_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_modify_wq");
}

int ibv_cmd_destroy_wq(struct ibv_wq* wq) { FAIL_ERRNO_VALUE("ibv_cmd_destroy_wq"); }

int ibv_cmd_create_rwq_ind_table(struct ibv_context* context,
                                 struct ibv_rwq_ind_table_init_attr* init_attr,
                                 struct ibv_rwq_ind_table* rwq_ind_table,
                                 struct ib_uverbs_ex_create_rwq_ind_table_resp* resp,
                                 size_t resp_size) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_rwq_ind_table");
}

int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table* rwq_ind_table) {
  FAIL_ERRNO_VALUE("ibv_cmd_destroy_rwq_ind_table");
}

int ibv_cmd_create_counters(struct ibv_context* context, struct ibv_counters_init_attr* init_attr,
                            struct verbs_counters* vcounters, struct ibv_command_buffer* link) {
  FAIL_ERRNO_VALUE("ibv_cmd_create_counters");
}

int ibv_cmd_destroy_counters(struct verbs_counters* vcounters) {
  FAIL_ERRNO_VALUE("ibv_cmd_destroy_counters");
}

int ibv_cmd_read_counters(struct verbs_counters* vcounters, uint64_t* counters_value,
                          uint32_t ncounters, uint32_t flags, struct ibv_command_buffer* link) {
  FAIL_ERRNO_VALUE("ibv_cmd_read_counters");
}

int ibv_cmd_alloc_dm(struct ibv_context* ctx, const struct ibv_alloc_dm_attr* dm_attr,
                     struct verbs_dm* dm, struct ibv_command_buffer* link) {
  FAIL_ERRNO_VALUE("ibv_cmd_alloc_dm");
}

int ibv_cmd_free_dm(struct verbs_dm* dm) { FAIL_ERRNO_VALUE("ibv_cmd_free_dm"); }

int ibv_cmd_reg_dm_mr(struct ibv_pd* pd, struct verbs_dm* dm, uint64_t offset, size_t length,
                      unsigned int access, struct verbs_mr* vmr, struct ibv_command_buffer* link) {
  FAIL_ERRNO_VALUE("ibv_cmd_reg_dm_mr");
}

}  // extern "C"
