// otelctx: a test workload that publishes an OpenTelemetry process context
// as OTEP 4719 specifies it (oteps/profiles/4719-process-ctx.md in
// open-telemetry/opentelemetry-specification; written from its text), then
// updates it while it runs.
//
// Usage: otelctx SECONDS UPDATE_AT SERVICE
//   publishes service.name=SERVICE, service.version=1.0,
//   deployment.environment.name=test and telemetry.sdk.language=cpp; spins
//   in before_update() until UPDATE_AT seconds, then publishes
//   service.version=2.0 (the OTEP's update protocol), prints
//   "updated <CLOCK_REALTIME ns>", and spins in after_update() until
//   SECONDS.
#include "otelctx.h"

static volatile uint64_t sink;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

// noipa: gcc -O2 would fold the two identical functions into one.
__attribute__((noipa)) static void before_update(double until)
{
  while (now_s() < until)
    for (int i = 0; i < 100000; i++)
      sink += (uint64_t)i * i;
}

__attribute__((noipa)) static void after_update(double until)
{
  while (now_s() < until)
    for (int i = 0; i < 100000; i++)
      sink += (uint64_t)i * i + 1;
}

int main(int argc, char **argv)
{
  if (argc != 4) {
    fprintf(stderr, "usage: %s SECONDS UPDATE_AT SERVICE\n", argv[0]);
    return 2;
  }
  double start = now_s();
  if (publish(argv[3], "1.0")) {
    perror("publishing the process context");
    return 1;
  }
  before_update(start + atof(argv[2]));
  update(argv[3], "2.0");
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  printf("updated %llu\n",
         (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
  fflush(stdout);
  after_update(start + atof(argv[1]));
  return 0;
}
