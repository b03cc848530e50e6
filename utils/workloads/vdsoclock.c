// A workload that spends its time in the vDSO: main -> vc_top ->
// clock_gettime (vDSO). Usage: vdsoclock SECONDS
#include <stdlib.h>

#include "workload.h"

static volatile double sink;

__attribute__((noinline)) void vc_top(double end)
{
  double t;
  do {
    t = now();
    sink += t;
  } while (t < end);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  vc_top(now() + (argc > 1 ? atof(argv[1]) : 5));
  return 0;
}
