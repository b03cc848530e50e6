// fakego looks like a Go program to a quick look but is C: Go's build
// information (go1.22.0), and the runtime's heap-profile globals
// (runtime.mbuckets pointing at garbage, runtime.mProfCycle,
// runtime.MemProfileRate) in its symbol table; it has no pclntab. It
// prints "ready" and waits for its standard input to end.
#include <stdio.h>
#include <unistd.h>

// The build information's inline form (Go 1.18 and newer): a 32-byte
// header (the magic, the pointer size, the flags: 2, strings inline), then
// the version and module strings, each after its length.
#define BUILDINFO                                                                                  \
  "\xff Go buildinf:\x08\x02"                                                                      \
  "\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"                                                               \
  "\x08go1.22.0"
__attribute__((section(".go.buildinfo"), used, aligned(16))) static const char buildinfo[64] =
  BUILDINFO;

unsigned long long fake_buckets __asm__("runtime.mbuckets") = 0x1000;
unsigned int fake_cycle __asm__("runtime.mProfCycle") = 6;
long fake_rate __asm__("runtime.MemProfileRate") = 512 * 1024;

int main(void)
{
  char buf[64];
  puts("ready");
  fflush(stdout);
  while (read(0, buf, sizeof buf) > 0) {
  }
  return 0;
}
