// The feasibility gate of `run --kernels` (issue 37): a CUPTI activity collector that the CUDA
// driver loads through CUDA_INJECTION64_PATH, measured on the GPU host by
// benches/kernels_gate.sh. It is an experiment, built there against the toolkit's own CUPTI
// headers: the collector that ships declares the few CUPTI types it reads by hand, and sends
// records to gpudiag over a socket instead of writing a summary file.
//
// What it answers:
//   * cost: which activity kinds, buffer sizes and duty cycles cost what on launch-heavy code;
//   * living beside torch.profiler: CUPTI has one pair of activity-buffer callbacks per process.
//     Kineto (torch.profiler) registers its own when a trace starts, which silently took the
//     naive collector's buffers away from both. Loaded also through LD_PRELOAD, this file
//     defines cuptiActivityRegisterCallbacks, cuptiActivityEnable, cuptiActivityDisable,
//     cuptiActivityFlushAll and cuptiFinalize, so Kineto's calls land here first. When Kineto
//     registers, ours are flushed and CUPTI is handed to Kineto for real; at Kineto's flush
//     after it disabled its kinds, CUPTI is taken back. Its trace is its own; ours has a hole,
//     counted. (Sharing instead — ours kept registered, Kineto's records copied into buffers it
//     hands out — left its trace empty and crashed the program: benches/RESULTS.md; the code is
//     in the commit that added this file.)
//
// Settings (environment):
//   GPUDIAG_KERNELS_OUT      directory for <pid>.json summaries (required; nothing is written
//                            without it)
//   GPUDIAG_KERNELS_KINDS    comma list of kernel,memcpy,memset,sync (default all four)
//   GPUDIAG_KERNELS_BUFFER_KB  activity buffer size (default 8192)
//   GPUDIAG_KERNELS_DUTY     ON_MS/PERIOD_MS: record ON_MS of every PERIOD_MS (default always)
//   GPUDIAG_KERNELS_DETACH   1: during the off part of the duty cycle detach CUPTI altogether
//                            (flush, cuptiFinalize) instead of disabling the kinds
//   GPUDIAG_KERNELS_GUEST    none: Kineto's calls pass through (the naive collector)
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef CUptiResult (*register_fn)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
typedef CUptiResult (*kind_fn)(CUpti_ActivityKind);
typedef CUptiResult (*finalize_fn)(void);
typedef CUptiResult (*next_record_fn)(uint8_t *, size_t, CUpti_Activity **);
typedef CUptiResult (*flush_all_fn)(uint32_t);
typedef CUptiResult (*flush_period_fn)(uint32_t);
typedef CUptiResult (*version_fn)(uint32_t *);
typedef CUptiResult (*dropped_fn)(CUcontext, uint32_t, size_t *);

static struct {
  void *cupti;
  const char *cupti_from;
  register_fn register_callbacks;
  kind_fn enable, disable;
  finalize_fn finalize;
  next_record_fn next_record;
  flush_all_fn flush_all;
  flush_period_fn flush_period;
  version_fn version;
  dropped_fn dropped;
} real;

// Which kinds we record, and which the guest (Kineto) has enabled: a kind stays enabled in
// CUPTI while either wants it.
#define MAX_KIND 128
static atomic_uchar ours_wanted[MAX_KIND];
static atomic_uchar ours_on[MAX_KIND];
static atomic_uchar guest_on[MAX_KIND];
static int detach_when_off;
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
static int detached;
static atomic_int active;
static size_t buffer_bytes = 8u << 20;
static int step_aside_for_guest = 1;
static int stepped_aside;
static struct timespec aside_since;
static const char *out_dir;

static pthread_mutex_t guest_lock = PTHREAD_MUTEX_INITIALIZER;
static CUpti_BuffersCallbackRequestFunc guest_request;
static CUpti_BuffersCallbackCompleteFunc guest_complete;

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uint64_t buffers, bytes, records, dropped;
  uint64_t kernels, kernel_ns, copies, copy_bytes, copy_ns, pageable_copies, sets, set_ns;
  uint64_t syncs, sync_ns;
  uint64_t finalize_calls, guest_registrations, detaches, reattaches, asides, aside_ns;
} stats;

// Kernel names by the pointer CUPTI hands out (it keeps one string per function); enough for
// a top list in the gate. Open addressing, fixed size: names past it are counted as "other".
#define NAME_SLOTS 4096
static struct name_stat {
  const char *name;
  uint64_t count, ns;
} names[NAME_SLOTS];
static uint64_t other_count, other_ns;

#define SYNC_TYPES 8
static uint64_t sync_count[SYNC_TYPES], sync_type_ns[SYNC_TYPES];
#define COPY_KINDS 16
static uint64_t copy_kind_count[COPY_KINDS], copy_kind_bytes[COPY_KINDS];

static void note(const char *what) {
  if (getenv("GPUDIAG_KERNELS_VERBOSE")) fprintf(stderr, "gpudiag collector[%d]: %s\n", getpid(), what);
}

static void *sym(const char *name) {
  void *f = real.cupti ? dlsym(real.cupti, name) : NULL;
  return f ? f : dlsym(RTLD_NEXT, name);
}

// The libcupti the process already has (PyTorch loads its wheel's copy: two copies in one
// process are undefined), else the one the loader finds.
static int find_cupti(void) {
  static const char *sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
  for (size_t i = 0; i < sizeof sonames / sizeof *sonames && !real.cupti; i++) {
    real.cupti = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
    if (real.cupti) real.cupti_from = "already loaded";
  }
  const char *given = getenv("GPUDIAG_CUPTI");
  if (!real.cupti && given) {
    real.cupti = dlopen(given, RTLD_NOW);
    if (real.cupti) real.cupti_from = "GPUDIAG_CUPTI";
  }
  for (size_t i = 0; i < sizeof sonames / sizeof *sonames && !real.cupti; i++) {
    real.cupti = dlopen(sonames[i], RTLD_NOW);
    if (real.cupti) real.cupti_from = "loader search";
  }
  if (!real.cupti) return 0;
  real.register_callbacks = (register_fn)dlsym(real.cupti, "cuptiActivityRegisterCallbacks");
  real.enable = (kind_fn)dlsym(real.cupti, "cuptiActivityEnable");
  real.disable = (kind_fn)dlsym(real.cupti, "cuptiActivityDisable");
  real.finalize = (finalize_fn)dlsym(real.cupti, "cuptiFinalize");
  real.next_record = (next_record_fn)dlsym(real.cupti, "cuptiActivityGetNextRecord");
  real.flush_all = (flush_all_fn)dlsym(real.cupti, "cuptiActivityFlushAll");
  real.flush_period = (flush_period_fn)dlsym(real.cupti, "cuptiActivityFlushPeriod");
  real.version = (version_fn)dlsym(real.cupti, "cuptiGetVersion");
  real.dropped = (dropped_fn)dlsym(real.cupti, "cuptiActivityGetNumDroppedRecords");
  return real.register_callbacks && real.enable && real.disable && real.next_record &&
         real.flush_all;
}

// The buffers we handed CUPTI. One the guest got from CUPTI before our callbacks replaced
// its own comes back to us too: it goes back to the guest whole, never to free().
#define OUTSTANDING 256
static pthread_mutex_t outstanding_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *outstanding[OUTSTANDING];

static int track(uint8_t *buffer, int add) {
  pthread_mutex_lock(&outstanding_lock);
  int found = 0;
  for (int i = 0; i < OUTSTANDING && !found; i++)
    if (outstanding[i] == (add ? NULL : buffer)) {
      outstanding[i] = add ? buffer : NULL;
      found = 1;
    }
  pthread_mutex_unlock(&outstanding_lock);
  return found;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, buffer_bytes);
  if (*buffer && !track(*buffer, 1)) {
    free(*buffer);
    *buffer = NULL;
  }
  *size = *buffer ? buffer_bytes : 0;
  *max_records = 0;
}

static void count_kernel(const CUpti_ActivityKernel10 *k) {
  uint64_t ns = k->end > k->start ? k->end - k->start : 0;
  stats.kernels++;
  stats.kernel_ns += ns;
  uintptr_t h = ((uintptr_t)k->name >> 4) % NAME_SLOTS;
  for (unsigned probe = 0; probe < 64; probe++, h = (h + 1) % NAME_SLOTS) {
    if (names[h].name == k->name || !names[h].name) {
      names[h].name = k->name;
      names[h].count++;
      names[h].ns += ns;
      return;
    }
  }
  other_count++;
  other_ns += ns;
}

static void count_record(const CUpti_Activity *r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      count_kernel((const CUpti_ActivityKernel10 *)r);
      break;
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)r;
      stats.copies++;
      stats.copy_bytes += m->bytes;
      stats.copy_ns += m->end > m->start ? m->end - m->start : 0;
      if (m->srcKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE ||
          m->dstKind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE)
        stats.pageable_copies++;
      copy_kind_count[m->copyKind % COPY_KINDS]++;
      copy_kind_bytes[m->copyKind % COPY_KINDS] += m->bytes;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const CUpti_ActivityMemset4 *s = (const CUpti_ActivityMemset4 *)r;
      stats.sets++;
      stats.set_ns += s->end > s->start ? s->end - s->start : 0;
      break;
    }
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
      const CUpti_ActivitySynchronization2 *s = (const CUpti_ActivitySynchronization2 *)r;
      uint64_t ns = s->end > s->start ? s->end - s->start : 0;
      stats.syncs++;
      stats.sync_ns += ns;
      sync_count[s->type % SYNC_TYPES]++;
      sync_type_ns[s->type % SYNC_TYPES] += ns;
      break;
    }
    default:
      break;
  }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
  if (!track(buffer, 0)) {
    pthread_mutex_lock(&guest_lock);
    if (guest_complete) guest_complete(ctx, stream, buffer, size, valid);
    pthread_mutex_unlock(&guest_lock);
    return;
  }
  pthread_mutex_lock(&stats_lock);
  stats.buffers++;
  stats.bytes += valid;
  CUpti_Activity *record = NULL;
  while (real.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    stats.records++;
    unsigned kind = record->kind;
    if (kind < MAX_KIND && ours_wanted[kind]) count_record(record);
  }
  if (real.dropped) {
    size_t dropped = 0;
    if (real.dropped(ctx, stream, &dropped) == CUPTI_SUCCESS) stats.dropped += dropped;
  }
  pthread_mutex_unlock(&stats_lock);
  free(buffer);
}

static void set_kind(unsigned kind, int on) {
  if (kind >= MAX_KIND) return;
  ours_on[kind] = on;
  if (on)
    real.enable((CUpti_ActivityKind)kind);
  else if (!guest_on[kind])
    real.disable((CUpti_ActivityKind)kind);
}

static long duty_on_ms, duty_period_ms;

static int guest_tracing(void) {
  for (unsigned k = 0; k < MAX_KIND; k++)
    if (guest_on[k]) return 1;
  return 0;
}

static void attach(void) {
  real.register_callbacks(buffer_requested, buffer_completed);
  for (unsigned k = 0; k < MAX_KIND; k++)
    if (ours_wanted[k]) set_kind(k, 1);
  if (real.flush_period) real.flush_period(1000);
}

// Off: flush what CUPTI holds, then detach it from the driver, which is what costs the launch
// path (disabling the kinds alone left most of the cost in place). Never while Kineto traces.
static void detach(void) {
  pthread_mutex_lock(&attach_lock);
  if (!detached && !guest_tracing() && real.finalize) {
    real.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (real.finalize() == CUPTI_SUCCESS) {
      detached = 1;
      stats.detaches++;
    }
  }
  pthread_mutex_unlock(&attach_lock);
}

static void reattach(void) {
  pthread_mutex_lock(&attach_lock);
  if (detached) {
    attach();
    detached = 0;
    stats.reattaches++;
  }
  pthread_mutex_unlock(&attach_lock);
}

static void *duty_cycle(void *unused) {
  (void)unused;
  for (;;) {
    struct timespec on = {duty_on_ms / 1000, (duty_on_ms % 1000) * 1000000};
    struct timespec off = {(duty_period_ms - duty_on_ms) / 1000,
                           ((duty_period_ms - duty_on_ms) % 1000) * 1000000};
    nanosleep(&on, NULL);
    if (detach_when_off) {
      detach();
    } else {
      for (unsigned k = 0; k < MAX_KIND; k++)
        if (ours_wanted[k]) set_kind(k, 0);
    }
    nanosleep(&off, NULL);
    if (detach_when_off) {
      reattach();
    } else {
      for (unsigned k = 0; k < MAX_KIND; k++)
        if (ours_wanted[k]) set_kind(k, 1);
    }
  }
  return NULL;
}

static const char *json_escape(const char *s, char *out, size_t cap) {
  size_t j = 0;
  for (; s && *s && j + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[j++] = '\\';
      out[j++] = (char)c;
    } else if (c < 0x20) {
      j += (size_t)snprintf(out + j, cap - j, "\\u%04x", c);
    } else {
      out[j++] = (char)c;
    }
  }
  out[j] = 0;
  return out;
}

static int by_ns(const void *a, const void *b) {
  const struct name_stat *x = a, *y = b;
  return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : 0;
}

static void write_summary(void) {
  if (!out_dir || !active) return;
  pthread_mutex_lock(&attach_lock);
  // Stepped aside, what CUPTI holds is Kineto's.
  if (real.flush_all && !detached && !stepped_aside) real.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  pthread_mutex_unlock(&attach_lock);
  char path[4096];
  snprintf(path, sizeof path, "%s/%d.json", out_dir, getpid());
  FILE *f = fopen(path, "w");
  if (!f) return;
  uint32_t version = 0;
  if (real.version) real.version(&version);
  pthread_mutex_lock(&stats_lock);
  static struct name_stat sorted[NAME_SLOTS];
  size_t n = 0;
  for (size_t i = 0; i < NAME_SLOTS; i++)
    if (names[i].name) sorted[n++] = names[i];
  qsort(sorted, n, sizeof *sorted, by_ns);
  char kinds[256] = "";
  for (unsigned k = 0; k < MAX_KIND; k++)
    if (ours_wanted[k]) snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%u", *kinds ? "," : "", k);
  fprintf(f,
          "{\"pid\":%d,\"cupti_api\":%u,\"cupti_from\":\"%s\",\"kinds\":[%s],\"buffer_kb\":%zu,"
          "\"duty\":[%ld,%ld],\"buffers\":%lu,\"bytes\":%lu,\"records\":%lu,\"dropped\":%lu,"
          "\"guest_registrations\":%lu,\"finalize_calls\":%lu,\"detaches\":%lu,\"reattaches\":%lu,"
          "\"asides\":%lu,\"aside_ns\":%lu,"
          "\"kernels\":%lu,\"kernel_ns\":%lu,"
          "\"copies\":%lu,\"copy_bytes\":%lu,\"copy_ns\":%lu,\"pageable_copies\":%lu,"
          "\"sets\":%lu,\"syncs\":%lu,\"sync_ns\":%lu,\"distinct_kernels\":%zu,"
          "\"other_kernels\":%lu,",
          getpid(), version, real.cupti_from ? real.cupti_from : "", kinds, buffer_bytes >> 10,
          duty_on_ms, duty_period_ms, stats.buffers, stats.bytes, stats.records, stats.dropped,
          stats.guest_registrations,
          stats.finalize_calls, stats.detaches, stats.reattaches, stats.asides, stats.aside_ns,
          stats.kernels, stats.kernel_ns, stats.copies, stats.copy_bytes,
          stats.copy_ns, stats.pageable_copies, stats.sets, stats.syncs, stats.sync_ns, n,
          other_count);
  fprintf(f, "\"sync_by_type\":{");
  for (int t = 0, first = 1; t < SYNC_TYPES; t++)
    if (sync_count[t]) {
      fprintf(f, "%s\"%d\":[%lu,%lu]", first ? "" : ",", t, sync_count[t], sync_type_ns[t]);
      first = 0;
    }
  fprintf(f, "},\"copy_by_kind\":{");
  for (int t = 0, first = 1; t < COPY_KINDS; t++)
    if (copy_kind_count[t]) {
      fprintf(f, "%s\"%d\":[%lu,%lu]", first ? "" : ",", t, copy_kind_count[t], copy_kind_bytes[t]);
      first = 0;
    }
  fprintf(f, "},\"top\":[");
  char escaped[1024];
  for (size_t i = 0; i < n && i < 15; i++)
    fprintf(f, "%s{\"name\":\"%s\",\"count\":%lu,\"ns\":%lu}", i ? "," : "",
            json_escape(sorted[i].name, escaped, sizeof escaped), sorted[i].count, sorted[i].ns);
  fprintf(f, "]}\n");
  pthread_mutex_unlock(&stats_lock);
  fclose(f);
}

static void parse_settings(void) {
  out_dir = getenv("GPUDIAG_KERNELS_OUT");
  const char *kb = getenv("GPUDIAG_KERNELS_BUFFER_KB");
  if (kb && atol(kb) >= 64) buffer_bytes = (size_t)atol(kb) << 10;
  const char *guest = getenv("GPUDIAG_KERNELS_GUEST");
  if (guest && !strcmp(guest, "none")) step_aside_for_guest = 0;
  const char *detach_setting = getenv("GPUDIAG_KERNELS_DETACH");
  detach_when_off = detach_setting && !strcmp(detach_setting, "1");
  const char *kinds = getenv("GPUDIAG_KERNELS_KINDS");
  if (!kinds) kinds = "kernel,memcpy,memset,sync";
  if (strstr(kinds, "kernel")) ours_wanted[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] = 1;
  if (strstr(kinds, "memcpy")) ours_wanted[CUPTI_ACTIVITY_KIND_MEMCPY] = 1;
  if (strstr(kinds, "memset")) ours_wanted[CUPTI_ACTIVITY_KIND_MEMSET] = 1;
  if (strstr(kinds, "sync")) ours_wanted[CUPTI_ACTIVITY_KIND_SYNCHRONIZATION] = 1;
  const char *duty = getenv("GPUDIAG_KERNELS_DUTY");
  if (duty && sscanf(duty, "%ld/%ld", &duty_on_ms, &duty_period_ms) == 2 &&
      (duty_on_ms <= 0 || duty_period_ms <= duty_on_ms))
    duty_on_ms = duty_period_ms = 0;
}

EXPORT int InitializeInjection(void) {
  static atomic_int once;
  if (atomic_exchange(&once, 1)) return 1;
  parse_settings();
  if (!out_dir) return 1;
  if (!find_cupti()) {
    note("no libcupti: nothing recorded");
    return 1;
  }
  if (real.register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
    note("cuptiActivityRegisterCallbacks failed");
    return 1;
  }
  active = 1;
  // Records reach us at least once a second even from a process that never fills a buffer,
  // so a SIGKILLed rank loses at most its last second.
  attach();
  if (duty_on_ms > 0) {
    pthread_t t;
    pthread_create(&t, NULL, duty_cycle, NULL);
    pthread_detach(t);
  }
  atexit(write_summary);
  note("recording");
  return 1;
}

// ---- Kineto's calls, when this file is also in LD_PRELOAD ----

// Hands CUPTI to the guest: what ours hold is flushed to us first, and our kinds the guest did
// not ask for are turned off, so its trace holds what it asked for.
static void step_aside(void) {
  pthread_mutex_lock(&attach_lock);
  if (!stepped_aside && !detached && guest_request && guest_complete) {
    real.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (unsigned k = 0; k < MAX_KIND; k++)
      if (ours_on[k] && !guest_on[k]) real.disable((CUpti_ActivityKind)k);
    real.register_callbacks(guest_request, guest_complete);
    stepped_aside = 1;
    clock_gettime(CLOCK_MONOTONIC, &aside_since);
    stats.asides++;
  }
  pthread_mutex_unlock(&attach_lock);
}

// The guest's trace is over (it flushed with none of its kinds on): CUPTI comes back to us.
static void take_back(void) {
  pthread_mutex_lock(&attach_lock);
  if (stepped_aside) {
    attach();
    stepped_aside = 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    stats.aside_ns += (uint64_t)(now.tv_sec - aside_since.tv_sec) * 1000000000u +
                      (uint64_t)(now.tv_nsec - aside_since.tv_nsec);
  }
  pthread_mutex_unlock(&attach_lock);
}

EXPORT CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                  CUpti_BuffersCallbackCompleteFunc complete) {
  pthread_mutex_lock(&guest_lock);
  guest_request = request;
  guest_complete = complete;
  stats.guest_registrations++;
  pthread_mutex_unlock(&guest_lock);
  if (active && step_aside_for_guest) {
    int aside = stepped_aside;
    if (aside) real.register_callbacks(request, complete);
    else step_aside();
    return CUPTI_SUCCESS;
  }
  register_fn f = real.register_callbacks ? real.register_callbacks
                                          : (register_fn)sym("cuptiActivityRegisterCallbacks");
  return f ? f(request, complete) : CUPTI_ERROR_NOT_INITIALIZED;
}

EXPORT CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  if ((unsigned)kind < MAX_KIND) guest_on[kind] = 1;
  if (active) reattach();
  // A guest that registered once and traces again without registering.
  if (active && step_aside_for_guest && !stepped_aside) step_aside();
  kind_fn f = real.enable ? real.enable : (kind_fn)sym("cuptiActivityEnable");
  return f ? f(kind) : CUPTI_ERROR_NOT_INITIALIZED;
}

EXPORT CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  if ((unsigned)kind < MAX_KIND) {
    guest_on[kind] = 0;
    if (active && !stepped_aside && ours_on[kind]) return CUPTI_SUCCESS;
  }
  kind_fn f = real.disable ? real.disable : (kind_fn)sym("cuptiActivityDisable");
  return f ? f(kind) : CUPTI_ERROR_NOT_INITIALIZED;
}

// Kineto flushes after it disabled its kinds: the end of its trace, so CUPTI comes back.
EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag) {
  flush_all_fn f = real.flush_all ? real.flush_all : (flush_all_fn)sym("cuptiActivityFlushAll");
  CUptiResult result = f ? f(flag) : CUPTI_ERROR_NOT_INITIALIZED;
  if (stepped_aside && !guest_tracing()) take_back();
  return result;
}

// Kineto finalises CUPTI when a trace ends (TEARDOWN_CUPTI): that would end our recording too.
// Its records are flushed to it first, as finalising would have done.
EXPORT CUptiResult cuptiFinalize(void) {
  stats.finalize_calls++;
  if (stepped_aside) take_back();
  if (active) {
    real.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    return CUPTI_SUCCESS;
  }
  finalize_fn f = real.finalize ? real.finalize : (finalize_fn)sym("cuptiFinalize");
  return f ? f() : CUPTI_ERROR_NOT_INITIALIZED;
}
