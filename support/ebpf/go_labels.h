// Goroutine labels (runtime/pprof's Do and SetGoroutineLabels): read at
// sample time from the goroutine the thread runs, through the runtime's
// structs (offsets in struct go_proc), and written after the trace's
// frames.
#ifndef GO_LABELS_H
#define GO_LABELS_H

#include "tracemgmt.h"

// A Go string or slice header: data pointer and length.
struct go_string {
  u64 ptr;
  s64 len;
};

// Go 1.9-1.23's map[string]string (runtime/map.go): the header's B (log2
// of the bucket count) and buckets pointer, and a bucket's layout: 8
// tophash bytes, 8 keys, 8 values, the overflow pointer. A slot is in use
// when its tophash is at least minTopHash (5). Labels maps are small (at
// most 6.5 labels per bucket before they grow) and never grow once built:
// the buckets, not the overflow chains nor old buckets, hold them.
#define GO_MAP_B             9
#define GO_MAP_BUCKETS       16
#define GO_BUCKET_SLOTS      8
#define GO_BUCKET_KEYS       8
#define GO_BUCKET_VALUES     (GO_BUCKET_KEYS + GO_BUCKET_SLOTS * sizeof(struct go_string))
#define GO_BUCKET_SIZE       (GO_BUCKET_VALUES + GO_BUCKET_SLOTS * sizeof(struct go_string) + 8)
#define GO_MIN_TOP_HASH      5
#define GO_BUCKET_OVERFLOW   (GO_BUCKET_SIZE - 8)
#define GO_MAX_LABEL_BUCKETS 2
// Bucket reads per sample: the two main buckets and an overflow bucket
// of each.
#define GO_MAX_BUCKET_VISITS 4

// The label slot i after the trace's frames (struct record's labels_room
// keeps it inside the record when the trace is full). The empty asm makes
// the compiler clamp the values where they are used: it would otherwise
// reuse a check made before it spilled them to the stack, whose bounds
// 5.10's verifier does not carry into the slot.
static __always_inline struct label *label_slot(struct trace *t, u32 i)
{
  u32 n = t->num_frames;
  asm volatile("" : "+r"(n), "+r"(i));
  if (n > MAX_FRAMES)
    n = MAX_FRAMES;
  if (i >= MAX_LABELS)
    i = MAX_LABELS - 1;
  return (struct label *)&t->frames[n] + i;
}

// Copies the len bytes at ptr (a Go string) into a label's key or value
// room of max bytes; returns the bytes copied, or -1 when the string could
// not be read.
static __always_inline int copy_go_string(char *dst, u32 max, u64 ptr, s64 len, u8 *flags, u8 cut)
{
  if (len < 0)
    return -1;
  u64 n = len;
  if (n > max) {
    n = max;
    *flags |= cut;
  }
  if (bpf_probe_read_user(dst, n & 0x3f, (void *)ptr))
    return -1;
  return n;
}

// Appends the label key = value to the sampled trace; returns -1 when it
// could not be read, 1 when the trace has MAX_LABELS already. A global
// function: the verifier checks it once on its own, not once per call
// site and path (kernel 7.2's gave up on the readers with it inlined at
// each of the map's slots). Hence scalar arguments and its own record
// lookup: 5.10 passes global functions no other pointers than the context.
__attribute__((noinline)) int push_go_label(u64 key, s64 key_len, u64 value, s64 value_len)
{
  struct record *r = get_record();
  if (!r)
    return -1;
  struct trace *t = &r->trace;
  u32 i = t->num_labels;
  if (i >= MAX_LABELS) {
    t->flags |= TRACE_FLAG_LABELS_CUT;
    return 1;
  }
  struct label *l = label_slot(t, i);
  u8 flags = 0;
  int kn = copy_go_string(l->key, LABEL_KEY_MAX, key, key_len, &flags, LABEL_KEY_CUT);
  int vn = copy_go_string(l->value, LABEL_VALUE_MAX, value, value_len, &flags, LABEL_VALUE_CUT);
  if (kn < 0 || vn < 0)
    return -1;
  l->key_len = kn;
  l->value_len = vn;
  l->flags = flags;
  t->num_labels = i + 1;
  if (flags)
    increment_metric(METRIC_GO_LABELS_CUT);
  return 0;
}

static __always_inline int push_label(const struct go_string *key, const struct go_string *value)
{
  return push_go_label(key->ptr, key->len, value->ptr, value->len);
}

// Reads Go 1.24+'s labels: a slice of {key, value} strings.
static __always_inline int read_go_label_slice(struct trace *t, u64 labels)
{
  struct go_string list, kv[2];
  if (bpf_probe_read_user(&list, sizeof(list), (void *)labels))
    return -1;
  for (u32 i = 0; i < MAX_LABELS + 1; i++) {
    if (i >= list.len)
      break;
    if (bpf_probe_read_user(kv, sizeof(kv), (void *)(list.ptr + i * sizeof(kv))))
      return -1;
    int err = push_label(&kv[0], &kv[1]);
    if (err)
      return err < 0 ? -1 : 0;
  }
  return 0;
}

// Reads Go 1.9-1.23's labels: a map[string]string. A bucket holds 8
// entries, then chains overflow buckets (the seed of each map's hash
// decides how many land in one): the main buckets and their overflow
// buckets are visited in order, GO_MAX_BUCKET_VISITS at most.
static __always_inline int read_go_label_map(struct trace *t, u64 labels)
{
  u64 hmap, buckets, bucket = 0;
  u8 log2_buckets, tophash[GO_BUCKET_SLOTS];
  if (bpf_probe_read_user(&hmap, sizeof(hmap), (void *)labels) || !hmap ||
      bpf_probe_read_user(&log2_buckets, 1, (void *)(hmap + GO_MAP_B)) ||
      bpf_probe_read_user(&buckets, sizeof(buckets), (void *)(hmap + GO_MAP_BUCKETS)))
    return -1;
  if (!buckets)
    return 0;
  u32 nbuckets = log2_buckets > 1 ? GO_MAX_LABEL_BUCKETS + 1 : 1u << log2_buckets;
  if (nbuckets > GO_MAX_LABEL_BUCKETS) {
    // More labels than fit in two buckets: more than MAX_LABELS.
    t->flags |= TRACE_FLAG_LABELS_CUT;
    nbuckets = GO_MAX_LABEL_BUCKETS;
  }
  u32 next = 0;
  for (u32 v = 0; v < GO_MAX_BUCKET_VISITS; v++) {
    if (!bucket) {
      if (next >= nbuckets)
        break;
      bucket = buckets + next++ * GO_BUCKET_SIZE;
    }
    if (bpf_probe_read_user(tophash, sizeof(tophash), (void *)bucket))
      return -1;
    for (u32 i = 0; i < GO_BUCKET_SLOTS; i++) {
      if (tophash[i] < GO_MIN_TOP_HASH)
        continue;
      struct go_string key, value;
      if (bpf_probe_read_user(&key, sizeof(key),
                              (void *)(bucket + GO_BUCKET_KEYS + i * sizeof(key))) ||
          bpf_probe_read_user(&value, sizeof(value),
                              (void *)(bucket + GO_BUCKET_VALUES + i * sizeof(value))))
        return -1;
      int err = push_label(&key, &value);
      if (err)
        return err < 0 ? -1 : 0;
    }
    if (bpf_probe_read_user(&bucket, sizeof(bucket), (void *)(bucket + GO_BUCKET_OVERFLOW)))
      return -1;
  }
  return 0;
}

// The g of the current thread: the runtime keeps it in static TLS, or in
// x28 while arm64 Go code runs.
static __always_inline u64 go_current_g(const struct go_proc *p, const struct record *r)
{
#if defined(__TARGET_ARCH_arm64)
  if (p->g_in_register)
    return r->state.user_regs.regs[28];
#endif
  u64 tp = thread_pointer(), g = 0;
  if (!tp || bpf_probe_read_user(&g, sizeof(g), (void *)(tp + p->tls_offset)))
    return 0;
  return g;
}

// Reads the labels of the goroutine the thread runs, if its process is a
// Go program user space described: g -> m -> curg (the goroutine, whether
// the thread is on its stack, the system stack or in a signal handler) ->
// labels. curg's m must lead back to the m: a stale or foreign g (a
// register C code reused) is not trusted.
static __always_inline void read_go_labels(struct record *r)
{
  struct trace *t = &r->trace;
  const struct go_proc *p = bpf_map_lookup_elem(&go_procs, &t->pid);
  if (!p)
    return;
  u64 g = go_current_g(p, r), m = 0, curg = 0, curg_m = 0, labels = 0;
  if (!g)
    return; // a thread the runtime did not create (cgo), or between goroutines
  if (bpf_probe_read_user(&m, sizeof(m), (void *)(g + p->g_m)) || !m ||
      bpf_probe_read_user(&curg, sizeof(curg), (void *)(m + p->m_curg))) {
    increment_metric(METRIC_ERR_GO_LABELS_READ);
    return;
  }
  if (!curg)
    return; // the thread runs no goroutine (the scheduler, idle)
  if (bpf_probe_read_user(&curg_m, sizeof(curg_m), (void *)(curg + p->g_m)) || curg_m != m ||
      bpf_probe_read_user(&labels, sizeof(labels), (void *)(curg + p->g_labels))) {
    increment_metric(METRIC_ERR_GO_LABELS_READ);
    return;
  }
  if (!labels)
    return;
  int err = p->labels_map ? read_go_label_map(t, labels) : read_go_label_slice(t, labels);
  if (err)
    increment_metric(METRIC_ERR_GO_LABELS_READ);
  if (t->num_labels)
    increment_metric(METRIC_GO_LABELS);
}

#endif // GO_LABELS_H
