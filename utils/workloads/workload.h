// Helpers shared by the test workloads.
#ifndef WORKLOAD_H
#define WORKLOAD_H

#include <time.h>

// Seconds on the monotonic clock.
static double now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif
