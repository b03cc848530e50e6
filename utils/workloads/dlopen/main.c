// Loads code while the profiler is watching. Optionally it first makes
// MAPPINGS one-page mappings the kernel cannot merge (alternating
// protections; one in 100 anonymous and executable, 16 executable mappings
// of its own file) and prints "mapped" with the wall-clock time. Then it
// spins in main -> dm_wait until DELAY seconds after start, dlopen()s
// LIBRARY, prints "loaded" with the wall-clock time, and spins in main ->
// dm_call -> dl_top -> dl_leaf (the dl_ functions are the library's) until
// SECONDS after start.
// Usage: dlopen LIBRARY DELAY SECONDS [MAPPINGS]
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../workload.h"

static volatile unsigned long sink;

static double wall(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void make_mappings(long n)
{
  const long page = sysconf(_SC_PAGESIZE);
  char *base = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  // Neighbours always differ in protection, so no two pages merge.
  for (long i = 1; i < n; i += 2) {
    int prot = i % 100 == 51 ? PROT_READ | PROT_EXEC : PROT_READ;
    if (mprotect(base + i * page, page, prot)) {
      perror("mprotect (raise vm.max_map_count?)");
      exit(1);
    }
  }
  int fd = open("/proc/self/exe", O_RDONLY);
  for (long j = 0; j < 16 && fd >= 0; j++) {
    char *at = base + (j * (n / 16) + 1) * page;
    if (mmap(at, page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
      perror("mmap of /proc/self/exe");
      exit(1);
    }
  }
  printf("mapped %.6f\n", wall());
  fflush(stdout);
}

__attribute__((noinline)) void dm_wait(double until)
{
  while (now() < until)
    for (int i = 0; i < 100000; i++)
      sink += i;
}

// Called through a pointer, dl_top has the executable as its caller.
__attribute__((noinline)) void dm_call(void (*fn)(void))
{
  fn();
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  if (argc < 4) {
    fprintf(stderr, "usage: %s LIBRARY DELAY SECONDS [MAPPINGS]\n", argv[0]);
    return 2;
  }
  double start = now();
  if (argc > 4)
    make_mappings(atol(argv[4]));
  dm_wait(start + atof(argv[2]));
  void *lib = dlopen(argv[1], RTLD_NOW);
  void (*top)(void) = lib ? (void (*)(void))dlsym(lib, "dl_top") : NULL;
  if (!top) {
    fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  printf("loaded %.6f\n", wall());
  fflush(stdout);
  double end = start + atof(argv[3]);
  while (now() < end)
    dm_call(top);
  return 0;
}
