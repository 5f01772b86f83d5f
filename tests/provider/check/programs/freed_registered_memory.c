/* Mistake: freeing a buffer while an MR still registers it (the MR is
 * deregistered only afterwards). */
#include "common.h"

int main(void) {
  struct pair p;
  open_pair(&p, 64, 0);
  free(p.buf);
  p.buf = NULL;
  close_pair(&p);
  return 0;
}
