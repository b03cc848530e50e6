// A fake libpython3.11.so.1.0: the symbols the CPython unwinder looks for,
// over random bytes (filled at load time), and an "interpreter loop" that
// only spins. Loaded by fakeruntimes.c.
#include <stdint.h>
#include <stdio.h>

// PY_VERSION_HEX of 3.11.4: the unwinder takes the layout of 3.11.
const uint32_t Py_Version = 0x030b04f0;
// The runtime state the unwinder starts from: random.
unsigned char _PyRuntime[1 << 16];

static volatile unsigned long sink;

__attribute__((noinline)) void _PyEval_EvalFrameDefault(void)
{
  for (int i = 0; i < 1000000; i++)
    sink += (unsigned long)i * i;
}

__attribute__((constructor)) static void fill(void)
{
  FILE *f = fopen("/dev/urandom", "r");
  if (f) {
    fread(_PyRuntime, 1, sizeof(_PyRuntime), f);
    fclose(f);
  }
}
