// otelspans_lib.c: the OpenTelemetry thread context pointer (OTEP 4947's
// otel_thread_ctx_v1) in a shared library, for otelspans.c built with
// -DTHREAD_CTX_IN_LIB: built with -mtls-dialect=gnu2 (TLSDESC, as the OTEP
// recommends), gnu (general-dynamic, __tls_get_addr) or
// -ftls-model=initial-exec (a GOT slot holding the offset).
#include <stddef.h>

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;

// Attaches a record to the calling thread (NULL detaches).
__attribute__((visibility("default"))) void otelspans_attach(void *record)
{
  // A compiler fence: the record is complete before the pointer is seen.
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
  otel_thread_ctx_v1 = record;
}
