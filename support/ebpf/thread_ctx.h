// OpenTelemetry thread context (OTEP 4947): the trace and span a thread
// is in, and the attributes its SDK set, read at sample time through the
// thread-local pointer otel_thread_ctx_v1. The thread is interrupted, so
// the record is read as its writer left it: one that is not valid (being
// written) is skipped.
#ifndef THREAD_CTX_H
#define THREAD_CTX_H

#include "go_labels.h"
#include "tracemgmt.h"

// Appends an attribute, its key (kl[0]) an index into the process's key
// table, its value the kl[1] bytes at value; returns -1 when it could not
// be read.
static __always_inline int push_thread_ctx_attr(struct trace *t, const u8 kl[2], u64 value)
{
  u32 i = t->num_labels;
  if (i >= MAX_LABELS) {
    t->flags |= TRACE_FLAG_LABELS_CUT;
    return 0;
  }
  struct label *l = label_slot(t, i);
  u8 flags = LABEL_KEY_INDEX;
  u32 n = kl[1];
  if (n > LABEL_VALUE_MAX) {
    n = LABEL_VALUE_MAX;
    flags |= LABEL_VALUE_CUT;
  }
  if (n && bpf_probe_read_user(l->value, n & 0x3f, (void *)value))
    return -1;
  l->key[0] = kl[0];
  l->key_len = 1;
  l->value_len = n;
  l->flags = flags;
  t->num_labels = i + 1;
  return 0;
}

// Reads the thread's context, if its process has one user space found.
static __always_inline void read_thread_context(struct trace *t)
{
  const struct thread_ctx_proc *p = bpf_map_lookup_elem(&thread_ctx_procs, &t->pid);
  if (!p)
    return;
  u64 tp = thread_pointer(), var = 0, record = 0, module = 0;
  if (tp && p->got_pair) {
    if (!bpf_probe_read_user(&module, sizeof(module), (void *)p->tls_index))
      var = tls_dtv_variable(tp, module, p->tls_offset);
  } else if (tp) {
    var = tls_variable_address(tp, p->tls_index, p->tls_offset);
  }
  if (!var || bpf_probe_read_user(&record, sizeof(record), (void *)var)) {
    increment_metric(METRIC_ERR_THREAD_CTX_READ);
    return;
  }
  if (!record)
    return; // no context attached
  u8 h[THREAD_CTX_HEADER_SIZE];
  if (bpf_probe_read_user(h, sizeof(h), (void *)record)) {
    increment_metric(METRIC_ERR_THREAD_CTX_READ);
    return;
  }
  if (h[THREAD_CTX_VALID] != 1) {
    increment_metric(METRIC_THREAD_CTX_INVALID);
    return;
  }
  u64 ids = 0;
  __builtin_memcpy(&ids, &h[THREAD_CTX_SPAN_ID], sizeof(ids));
  if (ids && !(t->flags & TRACE_FLAG_APM_CONTEXT)) {
    __builtin_memcpy(t->apm.trace_id, &h[THREAD_CTX_TRACE_ID], sizeof(t->apm.trace_id));
    __builtin_memcpy(t->apm.span_id, &h[THREAD_CTX_SPAN_ID], sizeof(t->apm.span_id));
    t->flags |= TRACE_FLAG_SPAN_CONTEXT;
    increment_metric(METRIC_SPAN_CONTEXTS);
  }
  u32 size = h[THREAD_CTX_ATTRS_SIZE] | (u32)h[THREAD_CTX_ATTRS_SIZE + 1] << 8;
  if (size > THREAD_CTX_MAX_ATTRS)
    size = THREAD_CTX_MAX_ATTRS;
  u32 off = 0;
  for (u32 k = 0; k < MAX_LABELS + 1; k++) {
    u8 kl[2];
    u64 entry = record + THREAD_CTX_HEADER_SIZE + off;
    // A complete entry (key, length, value) or none.
    if (off + 2 > size || bpf_probe_read_user(kl, sizeof(kl), (void *)entry) ||
        off + 2 + kl[1] > size || push_thread_ctx_attr(t, kl, entry + 2))
      break;
    off += 2 + kl[1];
  }
}

#endif // THREAD_CTX_H
