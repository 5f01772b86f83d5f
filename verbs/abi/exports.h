// Prototypes of libibverbs.so.1 exports that Debian's installed rdma-core 44
// headers do not declare, plus one enum value the installed verbs.h lacks.
//
// - ibv_copy_*_from_kern / _to_kern were declared in rdma-core's
//   <infiniband/marshall.h>, and ibv_get_sysfs_path / ibv_read_sysfs_file in
//   its <infiniband/driver.h>; neither header is installed.
// - The IBVERBS_PRIVATE_34 functions are declared in rdma-core's uninstalled
//   libibverbs/driver.h and infiniband/cmd_ioctl.h. Their parameter types
//   (verbs_mr, ibv_command_buffer, the kern-abi command structs, ...) are not
//   installed either: they appear here as incomplete struct types. Only the
//   symbol and the C calling convention are ABI; every argument is a pointer or
//   a scalar in the same position as in rdma-core, so an incomplete type is
//   exactly as good as the real one.
//
// Include this header after <infiniband/verbs.h> (it includes it first itself).
#pragma once

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cstddef>
#include <cstdint>

// rdma-core 62 added IBV_EVENT_DEVICE_SPEED_CHANGE = 20, after
// IBV_EVENT_WQ_FATAL (19). The installed rdma-core 44 verbs.h lacks it. Newer
// headers declare it as an enumerator; this macro is only defined when no such
// macro exists, and verbs.h is already included (include guard), so the
// enumerator declaration can never be rewritten by it.
#ifndef IBV_EVENT_DEVICE_SPEED_CHANGE
#define IBV_EVENT_DEVICE_SPEED_CHANGE (static_cast<enum ibv_event_type>(20))
#endif

// Types of the private provider ABI that no installed header defines.
struct verbs_device_ops;
struct verbs_context_ops;
struct verbs_sysfs_dev;
struct verbs_mr;
struct verbs_xrcd;
struct verbs_cq;
struct verbs_srq;
struct verbs_qp;
struct verbs_dm;
struct verbs_counters;
struct verbs_flow_action;
struct ibv_command_buffer;
// kern-abi.h command structs (the `struct ibv_<verb>` command layouts). Several
// share a name with a verbs.h function; C++ keeps the two apart, and these are
// only ever named with `struct` in front.
struct ibv_get_context;
struct ibv_query_port;
struct ibv_alloc_pd;
struct ibv_open_xrcd;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_alloc_mw;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_resize_cq;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_create_wq;
struct ibv_modify_wq;

extern "C" {

// ---- IBVERBS_1.0 / 1.1: kernel struct copies (marshall.h) -----------------
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr* dst, struct ib_uverbs_qp_attr* src);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr* dst, struct ib_uverbs_ah_attr* src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec* dst, struct ib_user_path_rec* src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec* dst, struct ibv_sa_path_rec* src);

// ---- IBVERBS_1.0: sysfs helpers (driver.h) ---------------------------------
const char* ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

// ---- IBVERBS_1.1: fork helpers (declared in driver.h, not verbs.h) ---------
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);

// ---- IBVERBS_PRIVATE_34 ----------------------------------------------------
// Set by the real library from RDMAV_ALLOW_DISASSOC_DESTROY; read by libmlx5.
extern bool verbs_allow_disassociate_destroy;

void verbs_register_driver_34(const struct verbs_device_ops* ops);
void __verbs_log(struct verbs_context* ctx, uint32_t level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
void* _verbs_init_and_alloc_context(struct ibv_device* device, int cmd_fd, size_t alloc_size,
                                    struct verbs_context* context_offset, uint32_t driver_id);
struct ibv_context* verbs_open_device(struct ibv_device* device, void* private_data);
void verbs_uninit_context(struct verbs_context* context);
void verbs_set_ops(struct verbs_context* vctx, const struct verbs_context_ops* ops);
void verbs_init_cq(struct ibv_cq* cq, struct ibv_context* context,
                   struct ibv_comp_channel* channel, void* cq_context);
int ibv_read_ibdev_sysfs_file(char* buf, size_t size, struct verbs_sysfs_dev* sysfs_dev,
                              const char* fnfmt, ...) __attribute__((format(printf, 4, 5)));
int execute_ioctl(struct ibv_context* context, struct ibv_command_buffer* cmd);
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, struct ibv_command_buffer* link);

int ibv_cmd_get_context(struct verbs_context* context, struct ibv_get_context* cmd,
                        size_t cmd_size, struct ib_uverbs_get_context_resp* resp,
                        size_t resp_size);
int ibv_cmd_query_context(struct ibv_context* ctx, struct ibv_command_buffer* driver);
int ibv_cmd_query_device_any(struct ibv_context* context,
                             const struct ibv_query_device_ex_input* input,
                             struct ibv_device_attr_ex* attr, size_t attr_size,
                             struct ib_uverbs_ex_query_device_resp* resp, size_t* resp_size);
int ibv_cmd_query_port(struct ibv_context* context, uint8_t port_num,
                       struct ibv_port_attr* port_attr, struct ibv_query_port* cmd,
                       size_t cmd_size);
int ibv_cmd_alloc_pd(struct ibv_context* context, struct ibv_pd* pd, struct ibv_alloc_pd* cmd,
                     size_t cmd_size, struct ib_uverbs_alloc_pd_resp* resp, size_t resp_size);
int ibv_cmd_dealloc_pd(struct ibv_pd* pd);
int ibv_cmd_open_xrcd(struct ibv_context* context, struct verbs_xrcd* xrcd, int vxrcd_size,
                      struct ibv_xrcd_init_attr* attr, struct ibv_open_xrcd* cmd, size_t cmd_size,
                      struct ib_uverbs_open_xrcd_resp* resp, size_t resp_size);
int ibv_cmd_close_xrcd(struct verbs_xrcd* xrcd);
int ibv_cmd_reg_mr(struct ibv_pd* pd, void* addr, size_t length, uint64_t hca_va, int access,
                   struct verbs_mr* vmr, struct ibv_reg_mr* cmd, size_t cmd_size,
                   struct ib_uverbs_reg_mr_resp* resp, size_t resp_size);
int ibv_cmd_rereg_mr(struct verbs_mr* vmr, uint32_t flags, void* addr, size_t length,
                     uint64_t hca_va, int access, struct ibv_pd* pd, struct ibv_rereg_mr* cmd,
                     size_t cmd_sz, struct ib_uverbs_rereg_mr_resp* resp, size_t resp_sz);
int ibv_cmd_dereg_mr(struct verbs_mr* vmr);
int ibv_cmd_query_mr(struct ibv_pd* pd, struct verbs_mr* vmr, uint32_t mr_handle);
int ibv_cmd_advise_mr(struct ibv_pd* pd, enum ibv_advise_mr_advice advice, uint32_t flags,
                      struct ibv_sge* sg_list, uint32_t num_sge);
int ibv_cmd_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova,
                          int fd, int access, struct verbs_mr* vmr);
int ibv_cmd_alloc_mw(struct ibv_pd* pd, enum ibv_mw_type type, struct ibv_mw* mw,
                     struct ibv_alloc_mw* cmd, size_t cmd_size,
                     struct ib_uverbs_alloc_mw_resp* resp, size_t resp_size);
int ibv_cmd_dealloc_mw(struct ibv_mw* mw);
int ibv_cmd_create_cq(struct ibv_context* context, int cqe, struct ibv_comp_channel* channel,
                      int comp_vector, struct ibv_cq* cq, struct ibv_create_cq* cmd,
                      size_t cmd_size, struct ib_uverbs_create_cq_resp* resp, size_t resp_size);
int ibv_cmd_create_cq_ex(struct ibv_context* context, const struct ibv_cq_init_attr_ex* cq_attr,
                         struct verbs_cq* cq, struct ibv_create_cq_ex* cmd, size_t cmd_size,
                         struct ib_uverbs_ex_create_cq_resp* resp, size_t resp_size,
                         uint32_t cmd_flags);
int ibv_cmd_poll_cq(struct ibv_cq* cq, int ne, struct ibv_wc* wc);
int ibv_cmd_req_notify_cq(struct ibv_cq* cq, int solicited_only);
int ibv_cmd_resize_cq(struct ibv_cq* cq, int cqe, struct ibv_resize_cq* cmd, size_t cmd_size,
                      struct ib_uverbs_resize_cq_resp* resp, size_t resp_size);
int ibv_cmd_destroy_cq(struct ibv_cq* cq);
int ibv_cmd_modify_cq(struct ibv_cq* cq, struct ibv_modify_cq_attr* attr,
                      struct ibv_modify_cq* cmd, size_t cmd_size);
int ibv_cmd_create_srq(struct ibv_pd* pd, struct ibv_srq* srq, struct ibv_srq_init_attr* attr,
                       struct ibv_create_srq* cmd, size_t cmd_size,
                       struct ib_uverbs_create_srq_resp* resp, size_t resp_size);
int ibv_cmd_create_srq_ex(struct ibv_context* context, struct verbs_srq* srq,
                          struct ibv_srq_init_attr_ex* attr_ex, struct ibv_create_xsrq* cmd,
                          size_t cmd_size, struct ib_uverbs_create_srq_resp* resp,
                          size_t resp_size);
int ibv_cmd_modify_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr, int srq_attr_mask,
                       struct ibv_modify_srq* cmd, size_t cmd_size);
int ibv_cmd_query_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr,
                      struct ibv_query_srq* cmd, size_t cmd_size);
int ibv_cmd_destroy_srq(struct ibv_srq* srq);
int ibv_cmd_create_qp(struct ibv_pd* pd, struct ibv_qp* qp, struct ibv_qp_init_attr* attr,
                      struct ibv_create_qp* cmd, size_t cmd_size,
                      struct ib_uverbs_create_qp_resp* resp, size_t resp_size);
int ibv_cmd_create_qp_ex(struct ibv_context* context, struct verbs_qp* qp,
                         struct ibv_qp_init_attr_ex* attr_ex, struct ibv_create_qp* cmd,
                         size_t cmd_size, struct ib_uverbs_create_qp_resp* resp,
                         size_t resp_size);
int ibv_cmd_create_qp_ex2(struct ibv_context* context, struct verbs_qp* qp,
                          struct ibv_qp_init_attr_ex* qp_attr, struct ibv_create_qp_ex* cmd,
                          size_t cmd_size, struct ib_uverbs_ex_create_qp_resp* resp,
                          size_t resp_size);
int ibv_cmd_open_qp(struct ibv_context* context, struct verbs_qp* qp, int vqp_sz,
                    struct ibv_qp_open_attr* attr, struct ibv_open_qp* cmd, size_t cmd_size,
                    struct ib_uverbs_create_qp_resp* resp, size_t resp_size);
int ibv_cmd_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* qp_attr, int attr_mask,
                     struct ibv_qp_init_attr* qp_init_attr, struct ibv_query_qp* cmd,
                     size_t cmd_size);
int ibv_cmd_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                      struct ibv_modify_qp* cmd, size_t cmd_size);
int ibv_cmd_modify_qp_ex(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                         struct ibv_modify_qp_ex* cmd, size_t cmd_size,
                         struct ib_uverbs_ex_modify_qp_resp* resp, size_t resp_size);
int ibv_cmd_destroy_qp(struct ibv_qp* qp);
int ibv_cmd_post_send(struct ibv_qp* ibqp, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr);
int ibv_cmd_post_recv(struct ibv_qp* ibqp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr);
int ibv_cmd_post_srq_recv(struct ibv_srq* srq, struct ibv_recv_wr* wr,
                          struct ibv_recv_wr** bad_wr);
int ibv_cmd_create_ah(struct ibv_pd* pd, struct ibv_ah* ah, struct ibv_ah_attr* attr,
                      struct ib_uverbs_create_ah_resp* resp, size_t resp_size);
int ibv_cmd_destroy_ah(struct ibv_ah* ah);
int ibv_cmd_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid);
int ibv_cmd_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid);
int ibv_cmd_create_flow(struct ibv_qp* qp, struct ibv_flow* flow_id,
                        struct ibv_flow_attr* flow_attr, void* ucmd, size_t ucmd_size);
int ibv_cmd_destroy_flow(struct ibv_flow* flow_id);
int ibv_cmd_create_flow_action_esp(struct ibv_context* ctx, struct ibv_flow_action_esp_attr* attr,
                                   struct verbs_flow_action* flow_action,
                                   struct ibv_command_buffer* driver);
int ibv_cmd_modify_flow_action_esp(struct verbs_flow_action* flow_action,
                                   struct ibv_flow_action_esp_attr* attr,
                                   struct ibv_command_buffer* driver);
int ibv_cmd_destroy_flow_action(struct verbs_flow_action* action);
int ibv_cmd_create_wq(struct ibv_context* context, struct ibv_wq_init_attr* wq_init_attr,
                      struct ibv_wq* wq, struct ibv_create_wq* cmd, size_t cmd_size,
                      struct ib_uverbs_ex_create_wq_resp* resp, size_t resp_size);
int ibv_cmd_modify_wq(struct ibv_wq* wq, struct ibv_wq_attr* attr, struct ibv_modify_wq* cmd,
                      size_t cmd_size);
int ibv_cmd_destroy_wq(struct ibv_wq* wq);
int ibv_cmd_create_rwq_ind_table(struct ibv_context* context,
                                 struct ibv_rwq_ind_table_init_attr* init_attr,
                                 struct ibv_rwq_ind_table* rwq_ind_table,
                                 struct ib_uverbs_ex_create_rwq_ind_table_resp* resp,
                                 size_t resp_size);
int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table* rwq_ind_table);
int ibv_cmd_create_counters(struct ibv_context* context, struct ibv_counters_init_attr* init_attr,
                            struct verbs_counters* vcounters, struct ibv_command_buffer* link);
int ibv_cmd_destroy_counters(struct verbs_counters* vcounters);
int ibv_cmd_read_counters(struct verbs_counters* vcounters, uint64_t* counters_value,
                          uint32_t ncounters, uint32_t flags, struct ibv_command_buffer* link);
int ibv_cmd_alloc_dm(struct ibv_context* ctx, const struct ibv_alloc_dm_attr* dm_attr,
                     struct verbs_dm* dm, struct ibv_command_buffer* link);
int ibv_cmd_free_dm(struct verbs_dm* dm);
int ibv_cmd_reg_dm_mr(struct ibv_pd* pd, struct verbs_dm* dm, uint64_t offset, size_t length,
                      unsigned int access, struct verbs_mr* vmr, struct ibv_command_buffer* link);

}  // extern "C"
