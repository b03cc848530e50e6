// A workload whose hot leaf is called back from libc: main -> qs_top ->
// qsort (libc, no frame pointers) -> qs_compare. Usage: qsortcb SECONDS
#include <stdlib.h>

#include "workload.h"

#define N 4096

static unsigned long values[N];

__attribute__((noinline)) static int qs_compare(const void *a, const void *b)
{
  // Make each comparison expensive so samples land in the callback.
  unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
  for (int i = 0; i < 256; i++) {
    x = x * 6364136223846793005UL + 1;
    y = y * 6364136223846793005UL + 1;
  }
  return x < y ? -1 : x > y;
}

__attribute__((noinline)) void qs_top(void)
{
  for (int i = 0; i < N; i++)
    values[i] = (unsigned long)rand();
  qsort(values, N, sizeof(values[0]), qs_compare);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  double end = now() + seconds;
  while (now() < end)
    qs_top();
  return 0;
}
