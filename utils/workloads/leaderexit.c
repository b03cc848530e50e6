// A process whose main thread exits first: a second thread spins for the
// number of seconds given as the argument, then the process ends.
// Usage: leaderexit SECONDS
#include <pthread.h>
#include <stdlib.h>

#include "workload.h"

volatile unsigned long sink;

__attribute__((noinline)) static void *le_spin(void *arg)
{
  double end = now() + *(double *)arg;
  while (now() < end)
    for (int i = 0; i < 100000; i++)
      sink += i;
  return NULL;
}

int main(int argc, char **argv)
{
  static double seconds;
  seconds = argc > 1 ? atof(argv[1]) : 2;
  pthread_t t;
  if (pthread_create(&t, NULL, le_spin, &seconds))
    return 1;
  pthread_exit(NULL);
}
