// otelspans: a test workload for OpenTelemetry thread contexts, written
// from OTEP 4947 (oteps/profiles/4947-thread-ctx.md in
// open-telemetry/opentelemetry-specification). It publishes a process
// context (otelctx.h) announcing the schema and the key table
// ["http.route", "tenant"], then runs two threads that go in and out of
// spans: a span lasts 60 ms (spinning in in_span), 30 ms follow outside
// any (in no_span). A span's record holds its trace and span ids and two
// attributes, http.route=/api/<thread> and tenant=tenant-<thread>; it is
// attached by swapping the thread's pointer (the OTEP's first strategy),
// between two buffers, and detached by storing NULL.
//
// Usage: otelspans SECONDS [nocontext]. With nocontext it publishes no
// process context, so a profiler does not read the records (for
// measuring what reading them costs). At the end it prints each span as
//   span <thread 0|1> <tid> <start ns> <end ns> <trace id hex> <span id hex>
// (CLOCK_REALTIME; the pointer was set at start and cleared at end).
// Built with -DTHREAD_CTX_IN_LIB, the pointer lives in otelspans_lib.c's
// shared library.
#include "otelctx.h"
#include <pthread.h>
#include <sys/syscall.h>

#ifdef THREAD_CTX_IN_LIB
void otelspans_attach(void *record);
#else
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
static void otelspans_attach(void *record)
{
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  otel_thread_ctx_v1 = record;
}
#endif

// The record, packed, in this machine's byte order.
struct record {
  uint8_t trace_id[16];
  uint8_t span_id[8];
  uint8_t valid;
  uint8_t trace_flags;
  uint16_t attrs_size;
  uint8_t attrs[612];
} __attribute__((packed));

#define MAX_SPANS 1000

struct span_log {
  int k, tid;
  uint64_t start, end;
  uint8_t trace_id[16], span_id[8];
};

static struct span_log logs[2][MAX_SPANS];
static int nlogs[2];
static double end_at;
static volatile uint64_t sink;

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t wall_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noipa)) static void in_span(double until)
{
  while (now_s() < until)
    for (int i = 0; i < 20000; i++)
      sink += (uint64_t)i * i;
}

__attribute__((noipa)) static void no_span(double until)
{
  while (now_s() < until)
    for (int i = 0; i < 20000; i++)
      sink += (uint64_t)i * i + 1;
}

static void put_entry(struct record *r, uint8_t key, const char *value)
{
  size_t n = strlen(value);
  r->attrs[r->attrs_size] = key;
  r->attrs[r->attrs_size + 1] = (uint8_t)n;
  memcpy(&r->attrs[r->attrs_size + 2], value, n);
  r->attrs_size += 2 + n;
}

static void *worker(void *arg)
{
  int k = (int)(intptr_t)arg, tid = (int)syscall(SYS_gettid);
  static __thread struct record bufs[2];
  char route[32], tenant[32];
  snprintf(route, sizeof(route), "/api/%d", k);
  snprintf(tenant, sizeof(tenant), "tenant-%d", k);
  for (int n = 0; now_s() < end_at; n++) {
    struct record *r = &bufs[n % 2];
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < 16; i++)
      r->trace_id[i] = (uint8_t)(0x10 * (k + 1) + i + n);
    for (int i = 0; i < 8; i++)
      r->span_id[i] = (uint8_t)(0xa0 + 0x10 * k + i + n * 3);
    r->trace_flags = 1;
    put_entry(r, 0, route);
    put_entry(r, 1, tenant);
    r->valid = 1;
    // Spans beyond the log's room run unlogged.
    struct span_log spare, *l = nlogs[k] < MAX_SPANS ? &logs[k][nlogs[k]++] : &spare;
    l->k = k;
    l->tid = tid;
    memcpy(l->trace_id, r->trace_id, 16);
    memcpy(l->span_id, r->span_id, 8);
    l->start = wall_ns();
    otelspans_attach(r);
    in_span(now_s() + 0.060);
    otelspans_attach(NULL);
    l->end = wall_ns();
    no_span(now_s() + 0.030);
  }
  return NULL;
}

static void hex(const uint8_t *b, int n)
{
  for (int i = 0; i < n; i++)
    printf("%02x", b[i]);
}

int main(int argc, char **argv)
{
  if (argc != 2 && argc != 3) {
    fprintf(stderr, "usage: %s SECONDS [nocontext]\n", argv[0]);
    return 2;
  }
  static const char *const keys[] = {"http.route", "tenant", NULL};
  thread_keys = keys;
  if (argc == 2 && publish("spans", "1.0")) {
    perror("publishing the process context");
    return 1;
  }
  end_at = now_s() + atof(argv[1]);
  pthread_t t[2];
  for (int k = 0; k < 2; k++)
    pthread_create(&t[k], NULL, worker, (void *)(intptr_t)k);
  for (int k = 0; k < 2; k++)
    pthread_join(t[k], NULL);
  for (int k = 0; k < 2; k++)
    for (int n = 0; n < nlogs[k]; n++) {
      struct span_log *l = &logs[k][n];
      printf("span %d %d %llu %llu ", l->k, l->tid, (unsigned long long)l->start,
             (unsigned long long)l->end);
      hex(l->trace_id, 16);
      printf(" ");
      hex(l->span_id, 8);
      printf("\n");
    }
  return 0;
}
