// The library half of the dlopen workload: its hot chain dl_top -> dl_leaf
// runs only after the executable dlopen()s it.
volatile unsigned long dl_sink;

__attribute__((noinline)) void dl_leaf(void)
{
  for (unsigned long i = 0; i < 2000000; i++)
    dl_sink += i * i;
}

// The empty asm after the call keeps it from becoming a tail jump.
__attribute__((noinline)) void dl_top(void)
{
  dl_leaf();
  __asm__ volatile("");
}
