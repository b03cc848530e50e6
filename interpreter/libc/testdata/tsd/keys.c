// A process for TestTSDLayoutLive: creates pthread keys until it holds
// the one given as argument, binds in the main thread and three others
// the address of a per-thread marker to it, prints
//	key K
//	thread TID MARKER  (one line per thread)
//	ready
// and sleeps. Built by the test with gcc (glibc) and musl-gcc (musl).
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_key_t key;
static pthread_barrier_t barrier;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static __thread char marker;

static void bind_marker(void)
{
  if (pthread_setspecific(key, &marker) != 0) {
    abort();
  }
  pthread_mutex_lock(&lock);
  printf("thread %ld %p\n", (long)syscall(SYS_gettid), (void *)&marker);
  pthread_mutex_unlock(&lock);
}

static void *run(void *arg)
{
  (void)arg;
  bind_marker();
  pthread_barrier_wait(&barrier);
  for (;;) {
    pause();
  }
  return NULL;
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    return 2;
  }
  unsigned want = (unsigned)atoi(argv[1]);
  do {
    if (pthread_key_create(&key, NULL) != 0) {
      return 1;
    }
  } while (key < want);
  printf("key %u\n", (unsigned)key);
  pthread_barrier_init(&barrier, NULL, 4);
  for (int i = 0; i < 3; i++) {
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) != 0) {
      return 1;
    }
  }
  bind_marker();
  pthread_barrier_wait(&barrier);
  printf("ready\n");
  fflush(stdout);
  for (;;) {
    pause();
  }
}
