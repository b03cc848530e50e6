// A test APM agent library, as the APM<->profiler correlation spec
// (../shared/reference/apm-profiler-correlation-spec.txt) describes one:
// it exports the thread-local pointer to each thread's correlation record
// and the global pointer to the process storage. Build it as
// elastic-jvmti-linux-<arch>.so with -fPIC -ftls-model=global-dynamic and
// -mtls-dialect=gnu2 (x86_64) or -mtls-dialect=desc (arm64), so that the
// thread-local variable is reached through a TLS descriptor.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

__attribute__((visibility("default"))) __thread void *elastic_apm_profiling_correlation_tls_v1;
__attribute__((visibility("default"))) void *elastic_apm_profiling_correlation_process_storage_v1;

// The thread-local record (spec: "thread-local storage"), 36 bytes.
struct __attribute__((packed)) tls_record {
  uint16_t layout_minor_version;
  uint8_t valid;
  uint8_t trace_present;
  uint8_t trace_flags;
  uint8_t trace_id[16];
  uint8_t span_id[8];
  uint8_t transaction_id[8];
};

static size_t put_str(uint8_t *p, const char *s)
{
  uint32_t n = strlen(s);
  memcpy(p, &n, 4);
  memcpy(p + 4, s, n);
  return 4 + n;
}

// Publishes the process storage; the pointer is set only once the buffer
// is complete.
int agent_publish_process_storage(const char *service, const char *env, const char *socket_path)
{
  uint8_t *buf = malloc(2 + 12 + strlen(service) + strlen(env) + strlen(socket_path));
  if (!buf)
    return -1;
  uint16_t minor = 1;
  memcpy(buf, &minor, 2);
  size_t n = 2;
  n += put_str(buf + n, service);
  n += put_str(buf + n, env);
  put_str(buf + n, socket_path);
  __atomic_store_n(&elastic_apm_profiling_correlation_process_storage_v1, buf, __ATOMIC_RELEASE);
  return 0;
}

// Publishes a storage whose service name claims a length of almost 4 GiB,
// as a hostile or broken agent might.
int agent_publish_absurd_storage(void)
{
  static uint8_t buf[2 + 4 + 16];
  uint16_t minor = 1;
  uint32_t n = 0xfffffff0u;
  memcpy(buf, &minor, 2);
  memcpy(buf + 2, &n, 4);
  __atomic_store_n(&elastic_apm_profiling_correlation_process_storage_v1, buf, __ATOMIC_RELEASE);
  return 0;
}

// Gives the calling thread its record, with no trace active.
int agent_thread_init(void)
{
  struct tls_record *r = calloc(1, sizeof(*r));
  if (!r)
    return -1;
  r->layout_minor_version = 1;
  r->valid = 1;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  elastic_apm_profiling_correlation_tls_v1 = r;
  return 0;
}

// Sets (trace_present = 1) or clears the calling thread's active trace in
// the spec's order: valid = 0, update, valid = 1. The fences keep the
// compiler from reordering the stores (the profiler samples the thread on
// its own CPU, so no hardware fence is needed).
void agent_set_trace(int present, const uint8_t trace_id[16], const uint8_t span_id[8],
                     const uint8_t transaction_id[8], uint8_t flags)
{
  struct tls_record *r = elastic_apm_profiling_correlation_tls_v1;
  if (!r)
    return;
  r->valid = 0;
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  r->trace_present = present;
  if (present) {
    r->trace_flags = flags;
    memcpy(r->trace_id, trace_id, 16);
    memcpy(r->span_id, span_id, 8);
    memcpy(r->transaction_id, transaction_id, 8);
  }
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  r->valid = 1;
}
