/* A user's program built against an installed cudalloc: it calls the
 * public API (include/cudalloc.h) and prints what it got. */
#include <stdio.h>

#include <cudalloc.h>

int main(void) {
  cudalloc_device_stats s;
  int rc = cudalloc_get_stats(0, &s, sizeof(s));
  printf("consumer: cudalloc %s, device 0 stats rc %d\n", cudalloc_version(), rc);
  return 0;
}
