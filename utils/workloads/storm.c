// A short-lived process for exec storms: spins for the given milliseconds of
// CPU time in HOT, a function name the build sets (-DHOT=storm_hot_3) so
// that each binary of a storm has its own. Usage: storm MILLISECONDS
#include <stdlib.h>
#include <time.h>

#ifndef HOT
#  define HOT storm_hot
#endif

static volatile unsigned long sink;

static double cpu_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) void HOT(double end)
{
  while (cpu_ms() < end)
    for (int i = 0; i < 20000; i++)
      sink += i;
}

int main(int argc, char **argv)
{
  HOT(argc > 1 ? atof(argv[1]) : 2);
  return 0;
}
