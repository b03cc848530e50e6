// A CPU-bound workload whose hot path is main -> cf_top -> cf_mid -> cf_leaf.
// Usage: fpchain SECONDS [PROGRAM ARGS...]
// With PROGRAM, it execs PROGRAM ARGS... when the time is up.
#include <stdlib.h>
#include <unistd.h>

#include "workload.h"

volatile unsigned long sink;

__attribute__((noinline)) void cf_leaf(void)
{
  for (unsigned long i = 0; i < 2000000; i++)
    sink += i * i;
}

// The empty asm after each call keeps the call from becoming a tail jump.
__attribute__((noinline)) void cf_mid(void)
{
  cf_leaf();
  __asm__ volatile("");
}

__attribute__((noinline)) void cf_top(void)
{
  cf_mid();
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  double end = now() + seconds;
  while (now() < end)
    cf_top();
  if (argc > 2) {
    execv(argv[2], &argv[2]);
    return 1;
  }
  return 0;
}
