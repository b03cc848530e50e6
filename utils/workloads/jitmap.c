// A workload that JIT-compiles a function and names it in its perf map,
// as Node with --perf-basic-prof or a JVM perf agent do. It writes jm_spin
// (a spin loop that keeps the frame pointer chain and then calls back into
// C) to anonymous executable memory, writes /tmp/perf-PID.map (PID as the
// process sees itself, so in a pid namespace its own), prints "ready", and
// spins in main -> jm_top -> jm_spin (JIT) -> jm_tick. x86_64 only.
//
// Usage: jitmap SECONDS [MODE]. MODE makes the perf map hostile instead:
//   symlink  a symlink to /etc/shadow
//   huge     a 1 GiB sparse file with garbage at its start
//   fifo     a named pipe nobody writes
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workload.h"

#if !defined(__x86_64__)
#  error "jitmap generates x86_64 code"
#endif

// jm_spin(iters, tick): push rbp; mov rbp, rsp; mov rcx, rdi;
// 1: dec rcx; jnz 1b; call rsi; pop rbp; ret.
static const unsigned char spin_code[] = {
  0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0xf9, 0x48, 0xff, 0xc9, 0x75, 0xfb, 0xff, 0xd6, 0x5d, 0xc3,
};

typedef void (*spin_fn)(long iters, void (*tick)(void));

static volatile unsigned long sink;

__attribute__((noinline)) void jm_tick(void)
{
  for (int i = 0; i < 1000; i++)
    sink += i;
}

__attribute__((noinline)) void jm_top(spin_fn spin, double deadline)
{
  while (now() < deadline)
    spin(2000000, jm_tick);
  __asm__ volatile("");
}

static int write_map(const char *path, const char *mode, void *code)
{
  if (strcmp(mode, "symlink") == 0)
    return symlink("/etc/shadow", path);
  if (strcmp(mode, "fifo") == 0)
    return mkfifo(path, 0644);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0)
    return -1;
  char line[128];
  int n;
  if (strcmp(mode, "huge") == 0) {
    memset(line, 0xa5, sizeof(line));
    n = sizeof(line);
    if (write(fd, line, n) != n || ftruncate(fd, 1L << 30) != 0)
      return -1;
  } else {
    // An entry elsewhere first, as JITs write many; then the function.
    n = snprintf(line, sizeof(line), "%lx 10 jm_other\n%lx %zx jm_spin\n", (unsigned long)code + 64,
                 (unsigned long)code, sizeof(spin_code));
    if (write(fd, line, n) != n)
      return -1;
  }
  return close(fd);
}

int main(int argc, char **argv)
{
  double deadline = now() + (argc > 1 ? atof(argv[1]) : 5);
  const char *mode = argc > 2 ? argv[2] : "map";
  void *mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return 1;
  memcpy(mem, spin_code, sizeof(spin_code));
  if (mprotect(mem, 4096, PROT_READ | PROT_EXEC) != 0)
    return 1;
  char path[64];
  snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
  // A map left by an earlier process of this pid (pids wrap) is not ours.
  unlink(path);
  if (write_map(path, mode, mem) != 0) {
    perror(path);
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  jm_top((spin_fn)mem, deadline);
  unlink(path);
  return 0;
}
