// C++ recursion 50 levels deep through a shared library of its own:
// main -> rec_exe(49) -> rec_lib(48) -> rec_exe(47) -> ... -> rec_lib(0)
// -> rec_leaf, which spins. Usage: recursion SECONDS
#include <cstdlib>
#include <ctime>

#include "rec.h"

static volatile unsigned long sink;
static double deadline;

static double now()
{
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

extern "C" __attribute__((noinline)) void rec_leaf()
{
  while (now() < deadline)
    for (int i = 0; i < 100000; i++)
      sink += i;
}

extern "C" __attribute__((noinline)) void rec_exe(int depth)
{
  if (depth == 0)
    rec_leaf();
  else
    rec_lib(depth - 1);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  deadline = now() + (argc > 1 ? atof(argv[1]) : 5);
  rec_exe(49);
  return 0;
}
