// otelctx.h: publishing an OpenTelemetry process context as OTEP 4719
// specifies it (oteps/profiles/4719-process-ctx.md in
// open-telemetry/opentelemetry-specification; written from its text), for
// the test workloads otelctx.c and otelspans.c. One translation unit
// includes it.
#ifndef OTELCTX_H
#define OTELCTX_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#  define PR_SET_VMA           0x53564d41
#  define PR_SET_VMA_ANON_NAME 0
#endif
#ifndef MFD_NOEXEC_SEAL
#  define MFD_NOEXEC_SEAL 0x0008U
#endif

// The header, in the OTEP's field order, naturally aligned: 32 bytes.
struct otel_ctx_header {
  char signature[8]; // "OTEL_CTX", no NUL
  uint32_t version;  // 2
  uint32_t payload_size;
  uint64_t published_at_ns; // 0 while being updated; written last
  uint64_t payload;         // pointer to the protobuf payload
};

static struct otel_ctx_header *header;

// A growing protobuf encoding.
struct buf {
  uint8_t data[4096];
  size_t len;
};

static void put_varint(struct buf *b, uint64_t v)
{
  while (v >= 0x80) {
    b->data[b->len++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  b->data[b->len++] = (uint8_t)v;
}

// A length-delimited field (wire type 2).
static void put_bytes(struct buf *b, int field, const void *p, size_t n)
{
  put_varint(b, (uint64_t)field << 3 | 2);
  put_varint(b, n);
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

// KeyValue{key = 1, value = 2: AnyValue{string_value = 1}} as field of b.
static void put_attr(struct buf *b, int field, const char *key, const char *value)
{
  struct buf any = {0}, kv = {0};
  put_bytes(&any, 1, value, strlen(value));
  put_bytes(&kv, 1, key, strlen(key));
  put_bytes(&kv, 2, any.data, any.len);
  put_bytes(b, field, kv.data, kv.len);
}

// The thread contexts' key table (OTEP 4947), published with the
// resource when set: NULL-terminated.
static const char *const *thread_keys;

// ProcessContext{resource = 1: Resource{attributes = 1}, attributes = 2:
// the thread contexts' schema and key table (an AnyValue's array_value =
// 5: ArrayValue{values = 1})}.
static uint8_t *encode(const char *service, const char *version, size_t *size)
{
  struct buf resource = {0}, ctx = {0};
  put_attr(&resource, 1, "service.name", service);
  put_attr(&resource, 1, "service.version", version);
  put_attr(&resource, 1, "deployment.environment.name", "test");
  put_attr(&resource, 1, "telemetry.sdk.language", "cpp");
  put_bytes(&ctx, 1, resource.data, resource.len);
  if (thread_keys) {
    struct buf values = {0}, array = {0}, kv = {0};
    put_attr(&ctx, 2, "threadlocal.schema_version", "tlsdesc_v1_dev");
    for (const char *const *k = thread_keys; *k; k++) {
      struct buf v = {0};
      put_bytes(&v, 1, *k, strlen(*k));
      put_bytes(&values, 1, v.data, v.len);
    }
    put_bytes(&array, 5, values.data, values.len);
    put_bytes(&kv, 1, "threadlocal.attribute_key_map", strlen("threadlocal.attribute_key_map"));
    put_bytes(&kv, 2, array.data, array.len);
    put_bytes(&ctx, 2, kv.data, kv.len);
  }
  uint8_t *p = malloc(ctx.len);
  memcpy(p, ctx.data, ctx.len);
  *size = ctx.len;
  return p;
}

static uint64_t boottime_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void name_mapping(void)
{
  // Unconditionally, errors ignored: a reader may hook the call.
  prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, (unsigned long)header, sizeof(*header), "OTEL_CTX");
}

static int publish(const char *service, const char *version)
{
  long page = sysconf(_SC_PAGESIZE);
  int fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0)
    fd = memfd_create("OTEL_CTX", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void *m = MAP_FAILED;
  if (fd >= 0 && ftruncate(fd, page) == 0)
    m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (fd >= 0)
    close(fd);
  if (m == MAP_FAILED)
    m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return -1;
  madvise(m, page, MADV_DONTFORK);
  header = m;
  size_t size;
  uint8_t *payload = encode(service, version, &size);
  memcpy(header->signature, "OTEL_CTX", 8);
  header->version = 2;
  header->payload_size = (uint32_t)size;
  header->payload = (uint64_t)(uintptr_t)payload;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_store_n(&header->published_at_ns, boottime_ns(), __ATOMIC_RELAXED);
  name_mapping();
  return 0;
}

__attribute__((unused)) static void update(const char *service, const char *version)
{
  size_t size;
  uint8_t *payload = encode(service, version, &size);
  uint64_t old = header->published_at_ns;
  void *old_payload = (void *)(uintptr_t)header->payload;
  __atomic_store_n(&header->published_at_ns, 0, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  header->payload = (uint64_t)(uintptr_t)payload;
  header->payload_size = (uint32_t)size;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  uint64_t now = boottime_ns();
  __atomic_store_n(&header->published_at_ns, now > old ? now : old + 1, __ATOMIC_RELAXED);
  name_mapping();
  free(old_payload);
}

#endif // OTELCTX_H
