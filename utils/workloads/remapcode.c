// Moves its own code every millisecond, as a hostile (or very unusual) JIT
// would: it maps the page of its executable that holds rc_leaf at a new
// address, runs rc_leaf there for about a millisecond, and unmaps the
// previous copy; main → rc_top → rc_leaf (the copy) for the seconds given
// as its first argument. It prints how many times it moved.
//
// rc_leaf uses registers and its stack only (no globals, no calls), so
// that a copy runs wherever it is mapped.
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, optimize("O1"))) unsigned long rc_leaf(unsigned long n)
{
  unsigned long s = 1;
  for (unsigned long i = 0; i < n; i++)
    s = s * 2862933555777941757UL + i;
  return s;
}

static volatile unsigned long sink;

__attribute__((noinline)) static void rc_top(unsigned long (*leaf)(unsigned long))
{
  sink += leaf(700000);
}

// text_offset finds the file offset of addr in the executable's mappings.
static long text_offset(uintptr_t addr)
{
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return -1;
  char line[512];
  long off = -1;
  while (fgets(line, sizeof(line), f)) {
    unsigned long start, end, fileoff;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s %lx", &start, &end, perms, &fileoff) == 4 && addr >= start &&
        addr < end) {
      off = (long)(addr - start + fileoff);
      break;
    }
  }
  fclose(f);
  return off;
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  int fd = open("/proc/self/exe", O_RDONLY);
  long page = sysconf(_SC_PAGESIZE);
  long off = text_offset((uintptr_t)rc_leaf);
  if (fd < 0 || off < 0) {
    perror("remapcode: finding rc_leaf");
    return 1;
  }
  long page_off = off & ~(page - 1);
  // Two pages, in case rc_leaf crosses into the next.
  size_t len = 2 * (size_t)page;
  void *prev = NULL;
  unsigned long moves = 0;
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  do {
    char *copy = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, page_off);
    if (copy == MAP_FAILED) {
      perror("remapcode: mmap");
      return 1;
    }
    rc_top((unsigned long (*)(unsigned long))(copy + (off - page_off)));
    if (prev)
      munmap(prev, len);
    prev = copy;
    moves++;
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
  printf("moves %lu\n", moves);
  return 0;
}
