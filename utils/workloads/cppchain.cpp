// A C++ chain for the symbolizer's tests: a namespace, a class template's
// member, a lambda and an operator overload, each with a frame of its own
// (noinline), and a static inline helper GCC inlines at -O2. Prints
// "ready" once, then runs for SECONDS.
// Usage: cppchain SECONDS
#include <chrono>
#include <cstdio>
#include <cstdlib>

#define NOINLINE __attribute__((noinline))

namespace geo
{

struct Vec {
  unsigned long x, y;
};

// Inlined into operator+ at -O2.
static inline unsigned long mix(unsigned long a, unsigned long b)
{
  return (a * 31 + b) ^ (a >> 3);
}

NOINLINE Vec operator+(const Vec &a, const Vec &b)
{
  Vec r = a;
  for (unsigned long i = 0; i < 2000; i++) // hot: operator+
    r.x = mix(r.x, b.y + i);
  r.y = r.x ^ b.x;
  return r;
}

template <typename T> struct Accumulator {
  NOINLINE T add(T n)
  {
    Vec v{n, n + 1};
    auto step = [&](unsigned long k) NOINLINE { return v + Vec{k, k * 3}; };
    for (unsigned long k = 0; k < 4; k++)
      v = step(k);
    return v.x;
  }
};

} // namespace geo

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 5;
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  geo::Accumulator<unsigned long> acc;
  unsigned long sink = 0;
  printf("ready\n");
  fflush(stdout);
  while (std::chrono::steady_clock::now() < end)
    for (int i = 0; i < 100; i++)
      sink += acc.add(sink & 0xff);
  return sink == 42;
}
