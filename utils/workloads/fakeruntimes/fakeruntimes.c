// Loads a fake libpython and a fake libjvm.so (fakepython.c, fakejvm.c:
// the symbols the runtime unwinders look for, over random bytes) from the
// paths given after the seconds, and runs main → fr_top → their spinning
// functions in turn until the seconds are up.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void fr_top(void (*a)(void), void (*b)(void))
{
  a();
  b();
  sink++;
}

int main(int argc, char **argv)
{
  if (argc < 4) {
    fprintf(stderr, "usage: fakeruntimes SECONDS LIBPYTHON LIBJVM\n");
    return 2;
  }
  double seconds = atof(argv[1]);
  void *py = dlopen(argv[2], RTLD_NOW), *jvm = dlopen(argv[3], RTLD_NOW);
  if (!py || !jvm) {
    fprintf(stderr, "fakeruntimes: %s\n", dlerror());
    return 1;
  }
  void (*eval)(void) = (void (*)(void))dlsym(py, "_PyEval_EvalFrameDefault");
  void (*spin)(void) = (void (*)(void))dlsym(jvm, "JVM_Spin");
  if (!eval || !spin) {
    fprintf(stderr, "fakeruntimes: %s\n", dlerror());
    return 1;
  }
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    fr_top(eval, spin);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  return 0;
}
