// Public entry points that nothing implements yet.
//
// Entries move out of this file as they are implemented: delete the stub here
// in the same change that adds the real function (the linker reports a
// duplicate definition otherwise).
//
// Each stub fails the way its man page says a failure looks: functions that
// return an int give the errno value EOPNOTSUPP, functions that return a
// pointer give NULL with errno = EOPNOTSUPP, void functions do nothing. Each
// logs once per process, at warn level, "X is not implemented yet by rdmaemu".

#include <errno.h>
#include <infiniband/verbs.h>

#include "verbs/abi/exports.h"
#include "verbs/abi/warn_once.h"

#define NOT_IMPLEMENTED(name) RDMAEMU_WARN_ONCE("{} is not implemented yet by rdmaemu", name)

#define FAIL_INT(name)    \
  do {                    \
    NOT_IMPLEMENTED(name); \
    return EOPNOTSUPP;    \
  } while (0)

#define FAIL_PTR(name)    \
  do {                    \
    NOT_IMPLEMENTED(name); \
    errno = EOPNOTSUPP;   \
    return nullptr;       \
  } while (0)

extern "C" {

// ---- QP (IBVERBS_1.1, 1.6, 1.14) ------------------------------------------
// Not a failure-returning verb: 1 means "data written in order", 0 "no
// guarantee". 0 is the answer that is never wrong.
int ibv_query_qp_data_in_order(struct ibv_qp* qp, enum ibv_wr_opcode op, uint32_t flags) {
  NOT_IMPLEMENTED("ibv_query_qp_data_in_order");
  return 0;
}

// ---- ECE (IBVERBS_1.10) -----------------------------------------------------
int ibv_query_ece(struct ibv_qp* qp, struct ibv_ece* ece) { FAIL_INT("ibv_query_ece"); }

int ibv_set_ece(struct ibv_qp* qp, struct ibv_ece* ece) { FAIL_INT("ibv_set_ece"); }


// ---- dma-buf MR (IBVERBS_1.12) ----------------------------------------------
struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length,
                                 uint64_t iova, int fd, int access) {
  FAIL_PTR("ibv_reg_dmabuf_mr");
}

}  // extern "C"
