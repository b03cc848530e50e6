// A context-switch storm: two threads hand a byte back and forth over two
// pipes as fast as they can, each blocking in read(2) between turns, for
// SECONDS (a million switches a second and more on an idle CPU pair).
// Usage: pingpong SECONDS
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "workload.h"

static int ping[2], pong[2];
static double end_at;

static void *ponger(void *arg)
{
  (void)arg;
  char c;
  while (read(ping[0], &c, 1) == 1 && c == 'p')
    if (write(pong[1], "o", 1) != 1)
      break;
  return NULL;
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  if (pipe(ping) || pipe(pong))
    return 1;
  end_at = now() + seconds;
  pthread_t t;
  pthread_create(&t, NULL, ponger, NULL);
  char c;
  for (unsigned long n = 0;; n++) {
    if ((n & 1023) == 0 && now() >= end_at)
      break;
    if (write(ping[1], "p", 1) != 1 || read(pong[0], &c, 1) != 1)
      return 1;
  }
  if (write(ping[1], "x", 1) != 1)
    return 1;
  pthread_join(t, NULL);
  return 0;
}
