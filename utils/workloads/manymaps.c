// Holds a huge mapping table, as a JVM or a browser with many libraries
// does, or a hostile process: it maps its own executable MAPPINGS times (30000
// by default), every other one executable, each one page at its own address,
// and then spins in main → mm_top → mm_leaf for the seconds given as its
// first argument. Only its own text is ever run.
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void mm_leaf(void)
{
  for (int i = 0; i < 1000000; i++)
    sink += (unsigned long)i * i;
}

__attribute__((noinline)) static void mm_top(void)
{
  mm_leaf();
  sink++;
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  int n = argc > 2 ? atoi(argv[2]) : 30000;
  int fd = open("/proc/self/exe", O_RDONLY);
  if (fd < 0) {
    perror("manymaps: /proc/self/exe");
    return 1;
  }
  long page = sysconf(_SC_PAGESIZE);
  // One reserved region, then the file's first page mapped over each page
  // of it: neighbours both map file offset 0, so the kernel cannot merge
  // them.
  char *base = mmap(NULL, (size_t)n * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    perror("manymaps: reserving");
    return 1;
  }
  for (int i = 0; i < n; i++) {
    int prot = i % 2 ? PROT_READ : PROT_READ | PROT_EXEC;
    if (mmap(base + (size_t)i * page, page, prot, MAP_PRIVATE | MAP_FIXED, fd, 0) == MAP_FAILED) {
      perror("manymaps: mapping");
      return 1;
    }
  }
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    mm_top();
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  return 0;
}
