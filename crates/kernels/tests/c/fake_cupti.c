// A stand-in libcupti for the collector's tests on machines without a GPU: it keeps the
// callbacks registered with it, and fake_emit() fills one buffer with records laid out as
// cupti_types.h declares them (the real layouts are held to that header by layout_check.c),
// then completes it, as CUPTI does when a buffer is full or flushed.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cupti_types.h"

#define SLOT 256  // every fake record takes this much, as a real record takes its own size

static gd_buffer_request_fn request;
static gd_buffer_complete_fn complete;
static int enabled[64];
static int registrations;
static gd_timestamp_fn timestamp;
// The callback API: one subscriber, as CUPTI allows.
static gd_callback_fn subscriber;
static int domains[8];
static int finalizations;

gd_result cuptiGetVersion(uint32_t *version) {
  const char *v = getenv("FAKE_CUPTI_VERSION");
  *version = v ? (uint32_t)strtoul(v, NULL, 10) : 130001;
  return 0;
}
gd_result cuptiGetTimestamp(uint64_t *t) {
  *t = 5000;
  return 0;
}
gd_result cuptiActivityRegisterCallbacks(gd_buffer_request_fn r, gd_buffer_complete_fn c) {
  request = r;
  complete = c;
  registrations++;
  return 0;
}
gd_result cuptiActivityEnable(gd_activity_kind k) {
  if (k >= 0 && k < 64) enabled[k] = 1;
  return 0;
}
gd_result cuptiActivityDisable(gd_activity_kind k) {
  if (k >= 0 && k < 64) enabled[k] = 0;
  return 0;
}
gd_result cuptiActivityFlushPeriod(uint32_t ms) {
  (void)ms;
  return 0;
}
// A buffer fake_hold() filled and CUPTI still holds, as it holds one until it is full or
// flushed; a flush completes it to whoever is registered then. A forced flush hands it over
// before the records are timed, as CUPTI does with records it has not finished: their ends 0.
static uint8_t *held;
static size_t held_size, held_valid;

gd_result cuptiActivityFlushAll(uint32_t flag) {
  if (held && complete) {
    if (flag & GD_FLUSH_FORCED)
      for (size_t at = 0; at + SLOT <= held_valid; at += SLOT) ((gd_kernel *)(held + at))->end = 0;
    uint8_t *buffer = held;
    held = NULL;
    complete(NULL, 0, buffer, held_size, held_valid);
  }
  return 0;
}
// Inside a runtime call, and not in its exit callback: where finalising crashed the real one
// (a driver call's exit nested in it).
static int in_runtime_call, at_runtime_exit, finalized_inside;

// Detaches everything, as the real one does: the callbacks, the kinds, the subscriber.
gd_result cuptiFinalize(void) {
  if (in_runtime_call && !at_runtime_exit) finalized_inside++;
  request = NULL;
  complete = NULL;
  memset(enabled, 0, sizeof enabled);
  subscriber = NULL;
  memset(domains, 0, sizeof domains);
  finalizations++;
  return 0;
}
// The thread that loaded us, as the program's own thread loads libcupti and calls cuInit (and
// so InitializeInjection) on it.
static pthread_t program_thread;
__attribute__((constructor)) static void remember_program_thread(void) {
  program_thread = pthread_self();
}
// Subscriptions from a thread of the collector's own while CUPTI was still as cuInit attached
// it: where, on an H200, the program died inside its next CUDA call.
static int subscribed_off_thread_first;

gd_result cuptiSubscribe(gd_subscriber *handle, gd_callback_fn callback, void *userdata) {
  (void)userdata;
  if (!finalizations && !pthread_equal(pthread_self(), program_thread))
    subscribed_off_thread_first++;
  if (subscriber) return 39;  // CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
  subscriber = callback;
  *handle = (gd_subscriber)&subscriber;
  return 0;
}
gd_result cuptiUnsubscribe(gd_subscriber handle) {
  (void)handle;
  subscriber = NULL;
  memset(domains, 0, sizeof domains);
  return 0;
}
gd_result cuptiEnableDomain(uint32_t on, gd_subscriber handle, gd_callback_domain domain) {
  (void)handle;
  if (domain >= 0 && domain < 8) domains[domain] = (int)on;
  return 0;
}
gd_result cuptiActivityRegisterTimestampCallback(gd_timestamp_fn fn) {
  timestamp = fn;
  return 0;
}
gd_result cuptiActivityGetNumDroppedRecords(gd_cucontext c, uint32_t s, size_t *dropped) {
  (void)c;
  (void)s;
  *dropped = 2;
  return 0;
}
gd_result cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, gd_activity **record) {
  uint8_t *next = *record ? (uint8_t *)*record + SLOT : buffer;
  if (next + SLOT > buffer + valid) return 12;  // CUPTI_ERROR_MAX_LIMIT_REACHED
  *record = (gd_activity *)next;
  return 0;
}

int fake_enabled(int kind) { return kind >= 0 && kind < 64 && enabled[kind]; }
int fake_finalizations(void) { return finalizations; }

// A CUDA runtime call with a driver call inside it, as cudaLaunchKernel makes cuLaunchKernel:
// the subscriber hears of each entry and exit, in that order.
void fake_cuda_call(void) {
  static const struct {
    gd_callback_domain domain;
    uint32_t site;
  } order[] = {{GD_DOMAIN_RUNTIME_API, 0},
               {GD_DOMAIN_DRIVER_API, 0},
               {GD_DOMAIN_DRIVER_API, 1},
               {GD_DOMAIN_RUNTIME_API, 1}};
  in_runtime_call = 1;
  for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
    gd_callback_fn cb = subscriber;
    gd_callback_data data = {order[i].site};
    at_runtime_exit = order[i].domain == GD_DOMAIN_RUNTIME_API && order[i].site == 1;
    if (cb && domains[order[i].domain]) cb(NULL, order[i].domain, 1, &data);
  }
  in_runtime_call = at_runtime_exit = 0;
}
int fake_finalized_inside_a_call(void) { return finalized_inside; }
int fake_subscribed_off_thread_before_a_finalize(void) { return subscribed_off_thread_first; }
int fake_registrations(void) { return registrations; }

static char long_name[3000];

// `kernels` kernels named kernel_a / kernel_b alternately (the first one with a 2,999-byte
// name), then one pageable host-to-device copy, one set and one stream synchronisation. What
// of it is enabled is what a real CUPTI would have recorded. Times are in ns from 0, or, once
// a client registered a clock, on that clock from its reading now, at its rate (the driver's
// guest clock ticks 3 times a ns).
int fake_emit(int kernels) {
  uint64_t base = timestamp ? timestamp() : 0;
  uint64_t per_ns = timestamp ? 3 : 1;
#define T(ns) (base + per_ns * (uint64_t)(ns))
  uint8_t *buffer = NULL;
  size_t size = 0, max_records = 0;
  if (!request) return -1;  // nobody attached
  request(&buffer, &size, &max_records);
  if (!buffer) return -1;
  memset(long_name, 'x', sizeof long_name - 1);
  size_t at = 0;
  for (int i = 0; i < kernels && (at + 1) * SLOT <= size; i++, at++) {
    gd_kernel *k = (gd_kernel *)(buffer + at * SLOT);
    memset(k, 0, SLOT);
    k->kind = GD_KIND_CONCURRENT_KERNEL;
    k->start = T(1000 + (uint64_t)i * 10);
    k->end = k->start + per_ns * 7;
    k->deviceId = 1;
    k->contextId = 3;
    k->streamId = 7;
    k->gridX = 128;
    k->gridY = 2;
    k->gridZ = 1;
    k->blockX = 256;
    k->blockY = 1;
    k->blockZ = 1;
    k->registersPerThread = 40;
    k->staticSharedMemory = 1024;
    k->dynamicSharedMemory = 2048;
    k->correlationId = (uint32_t)i + 1;
    k->graphId = i == 1 ? 9 : 0;
    k->name = i == 0 ? long_name : i % 2 ? "kernel_b" : "kernel_a";
  }
  gd_memcpy *m = (gd_memcpy *)(buffer + at++ * SLOT);
  memset(m, 0, SLOT);
  m->kind = GD_KIND_MEMCPY;
  m->copyKind = 1;
  m->srcKind = 1;
  m->dstKind = 3;
  m->bytes = 4096;
  m->start = T(50);
  m->end = T(60);
  m->deviceId = 1;
  m->contextId = 3;
  m->streamId = 7;
  m->correlationId = 77;
  gd_memset *s = (gd_memset *)(buffer + at++ * SLOT);
  memset(s, 0, SLOT);
  s->kind = GD_KIND_MEMSET;
  s->bytes = 512;
  s->start = T(70);
  s->end = T(71);
  s->deviceId = 1;
  s->contextId = 3;
  s->streamId = 7;
  s->correlationId = 78;
  gd_synchronization *y = (gd_synchronization *)(buffer + at++ * SLOT);
  memset(y, 0, SLOT);
  y->kind = GD_KIND_SYNCHRONIZATION;
  y->type = 3;
  y->start = T(80);
  y->end = T(95);
  y->contextId = 3;
  y->streamId = 7;
  y->correlationId = 79;
  y->cudaEventId = GD_SYNC_INVALID;
  complete(NULL, 0, buffer, size, at * SLOT);
  return (int)at;
#undef T
}

// `kernels` kernels named kernel_a into a buffer CUPTI keeps until a flush (see held).
int fake_hold(int kernels) {
  size_t max_records = 0;
  if (!request || held) return -1;
  request(&held, &held_size, &max_records);
  if (!held) return -1;
  int n = 0;
  for (; n < kernels && (size_t)(n + 1) * SLOT <= held_size; n++) {
    gd_kernel *k = (gd_kernel *)(held + (size_t)n * SLOT);
    memset(k, 0, SLOT);
    k->kind = GD_KIND_CONCURRENT_KERNEL;
    k->start = 1000 + (uint64_t)n * 10;
    k->end = k->start + 7;
    k->deviceId = 1;
    k->contextId = 3;
    k->streamId = 7;
    k->correlationId = (uint32_t)n + 1;
    k->name = "kernel_a";
  }
  held_valid = (size_t)n * SLOT;
  return n;
}

// For benches/kernels_memory.py: up to `kernels` kernels (one buffer's worth at most), the
// `first`-th on, named from a table of `names` names about 100 bytes long (as templated names
// run), every tenth an NCCL all-reduce when `nccl`; 1 µs apart, 700 ns long, on one GPU.
// Returns how many.
int fake_flood(int kernels, int names, long first, int nccl) {
  static char **table;
  static int table_size;
  static const char *all_reduce = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)";
  if (names < 1) names = 1;
  if (table_size != names) {
    table = realloc(table, (size_t)names * sizeof *table);
    if (!table) return -1;
    for (int i = 0; i < names; i++) {
      table[i] = malloc(112);
      if (!table[i]) return -1;
      snprintf(table[i], 112, "void flood_kernel_%07d<float, 128, 4, cutlass::arch::Sm90, at::native::Epilogue>(Params)", i);
    }
    table_size = names;
  }
  uint8_t *buffer = NULL;
  size_t size = 0, max_records = 0;
  if (!request) return -1;
  request(&buffer, &size, &max_records);
  if (!buffer) return -1;
  int n = 0;
  for (; n < kernels && (size_t)(n + 1) * SLOT <= size; n++) {
    long i = first + n;
    gd_kernel *k = (gd_kernel *)(buffer + (size_t)n * SLOT);
    memset(k, 0, SLOT);
    k->kind = GD_KIND_CONCURRENT_KERNEL;
    k->start = 1000 + (uint64_t)i * 1000;
    k->end = k->start + 700;
    k->deviceId = 0;
    k->contextId = 1;
    k->streamId = 7;
    k->gridX = 128;
    k->gridY = 1;
    k->gridZ = 1;
    k->blockX = 256;
    k->blockY = 1;
    k->blockZ = 1;
    k->registersPerThread = 64;
    k->correlationId = (uint32_t)i + 1;
    k->name = nccl && i % 10 == 9 ? all_reduce : table[i % names];
  }
  complete(NULL, 0, buffer, size, (size_t)n * SLOT);
  return n;
}
