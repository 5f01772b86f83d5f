/* Mistake: exiting with a QP, CQ, MR, PD and the context still alive. */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  connect_pair(&p, 8, 8);
  return 0;
}
