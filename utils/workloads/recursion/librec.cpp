// The library half of a recursion that alternates between a shared library
// and the executable: rec_lib calls back into the executable's rec_exe.
#include "rec.h"

extern "C" __attribute__((noinline)) void rec_lib(int depth)
{
  if (depth == 0)
    rec_leaf();
  else
    rec_exe(depth - 1);
  __asm__ volatile("");
}
