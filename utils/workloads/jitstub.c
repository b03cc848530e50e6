// A workload that runs through code it generated at run time, like a JIT
// without unwind information: main -> jit_top -> (a stub in anonymous
// executable memory) -> jit_leaf, which spins. The stub keeps the frame
// pointer chain (push rbp; mov rbp, rsp; call rdi; pop rbp; ret), as JIT
// compilers do. x86_64 only. Usage: jitstub SECONDS
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "workload.h"

static volatile unsigned long sink;
static double deadline;

__attribute__((noinline)) void jit_leaf(void)
{
  while (now() < deadline)
    for (int i = 0; i < 100000; i++)
      sink += i;
}

__attribute__((noinline)) void jit_top(void (*stub)(void (*)(void)))
{
  stub(jit_leaf);
  __asm__ volatile("");
}

int main(int argc, char **argv)
{
  static const unsigned char code[] = {0x55, 0x48, 0x89, 0xe5, 0xff, 0xd7, 0x5d, 0xc3};
  void *mem =
    mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return 1;
  memcpy(mem, code, sizeof(code));
  deadline = now() + (argc > 1 ? atof(argv[1]) : 5);
  jit_top((void (*)(void (*)(void)))mem);
  return 0;
}
