// Threads that wait in known places, for off-CPU profiling: one sleeps 10
// ms at a time in cf_sleep_leaf, one reads a pipe in cf_pipe_leaf (a
// feeder writes to it every 20 ms), one takes a mutex in cf_lock_leaf (a
// holder keeps it 15 ms at a time, sleeping), and one spins in cf_busy_leaf.
// Each measures the time it spent in its waiting calls that blocked: those
// that took 50 us or more (the lock thread takes the free mutex thousands
// of times while the holder sleeps; those calls run, they do not wait).
// After SECONDS it prints a line per thread, "thread NAME TID WAITED_NS",
// and exits.
// Usage: offcpu SECONDS
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload.h"

static double end_at;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static volatile unsigned long sink;

struct waiter {
  const char *name;
  void (*wait)(void);
  // blocks: the call waits (the busy thread's does not: its waited
  // stays 0).
  int blocks;
  pid_t tid;
  double waited;
};

static void sleep_ms(long ms)
{
  struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000};
  nanosleep(&ts, NULL);
}

__attribute__((noinline)) void cf_sleep_leaf(void) { sleep_ms(10); }
__attribute__((noinline)) void cf_sleep_mid(void)
{
  cf_sleep_leaf();
  __asm__ volatile("");
}

__attribute__((noinline)) void cf_pipe_leaf(void)
{
  char c;
  if (read(pipe_fds[0], &c, 1) != 1)
    sleep_ms(1);
}
__attribute__((noinline)) void cf_pipe_mid(void)
{
  cf_pipe_leaf();
  __asm__ volatile("");
}

__attribute__((noinline)) void cf_lock_leaf(void)
{
  pthread_mutex_lock(&lock);
  pthread_mutex_unlock(&lock);
}
__attribute__((noinline)) void cf_lock_mid(void)
{
  cf_lock_leaf();
  __asm__ volatile("");
}

__attribute__((noinline)) void cf_busy_leaf(void)
{
  for (int i = 0; i < 100000; i++)
    sink += i;
}
__attribute__((noinline)) void cf_busy_mid(void)
{
  cf_busy_leaf();
  __asm__ volatile("");
}

// Each waiter's loop: the time inside the waiting call, measured around it.
static void *run_waiter(void *arg)
{
  struct waiter *w = arg;
  w->tid = gettid();
  while (now() < end_at) {
    double t0 = now();
    w->wait();
    double took = now() - t0;
    if (w->blocks && took >= 50e-6)
      w->waited += took;
  }
  return NULL;
}

static void *feed_pipe(void *arg)
{
  (void)arg;
  while (now() < end_at + 0.1) {
    sleep_ms(20);
    if (write(pipe_fds[1], "x", 1) != 1)
      break;
  }
  return NULL;
}

static void *hold_lock(void *arg)
{
  (void)arg;
  while (now() < end_at + 0.1) {
    pthread_mutex_lock(&lock);
    sleep_ms(15);
    pthread_mutex_unlock(&lock);
    sleep_ms(1);
  }
  return NULL;
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  if (pipe(pipe_fds) != 0) {
    perror("pipe");
    return 1;
  }
  end_at = now() + seconds;
  struct waiter waiters[] = {
    {.name = "sleep", .wait = cf_sleep_mid, .blocks = 1},
    {.name = "pipe", .wait = cf_pipe_mid, .blocks = 1},
    {.name = "lock", .wait = cf_lock_mid, .blocks = 1},
    {.name = "busy", .wait = cf_busy_mid},
  };
  enum { N = sizeof(waiters) / sizeof(waiters[0]) };
  pthread_t threads[N], feeder, holder;
  pthread_create(&feeder, NULL, feed_pipe, NULL);
  pthread_create(&holder, NULL, hold_lock, NULL);
  for (int i = 0; i < N; i++)
    pthread_create(&threads[i], NULL, run_waiter, &waiters[i]);
  for (int i = 0; i < N; i++)
    pthread_join(threads[i], NULL);
  pthread_join(feeder, NULL);
  pthread_join(holder, NULL);
  for (int i = 0; i < N; i++)
    printf("thread %s %d %lld\n", waiters[i].name, waiters[i].tid,
           (long long)(waiters[i].waited * 1e9));
  return 0;
}
