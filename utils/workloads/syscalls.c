// A workload that spends its time in the kernel: main -> sc_top -> sc_read
// reading large blocks from /dev/zero. Usage: syscalls SECONDS
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "workload.h"

static char buf[1 << 20];

__attribute__((noinline)) void sc_read(int fd)
{
  for (int i = 0; i < 64; i++)
    if (read(fd, buf, sizeof(buf)) < 0)
      exit(1);
  __asm__ volatile("");
}

__attribute__((noinline)) void sc_top(int fd)
{
  sc_read(fd);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  int fd = open("/dev/zero", O_RDONLY);
  if (fd < 0)
    return 1;
  double end = now() + seconds;
  while (now() < end)
    sc_top(fd);
  return 0;
}
