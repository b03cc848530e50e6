// A short-lived process: spins in main -> ss_top -> ss_leaf for the given
// milliseconds of CPU time, then exits. Usage: shortspin MILLISECONDS
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static double cpu_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) void ss_leaf(double end)
{
  while (cpu_ms() < end)
    for (int i = 0; i < 20000; i++)
      sink += i;
}

__attribute__((noinline)) void ss_top(double end)
{
  ss_leaf(end);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  ss_top(argc > 1 ? atof(argv[1]) : 20);
  return 0;
}
