// The kernels collector of `gpudiag run --kernels`: a CUPTI activity collector that the CUDA
// driver loads into each CUDA process of the command (CUDA_INJECTION64_PATH names this file; the
// driver dlopens it during cuInit and calls InitializeInjection), and that LD_PRELOAD also loads
// so the process's own CUPTI client (torch.profiler's Kineto) reaches our interposed CUPTI
// calls first. It records kernels (concurrent-kernel kind), copies, sets and synchronisations
// and sends them to gpudiag over a Unix socket. Derived from the feasibility gate
// (benches/kernels_gate/collector.c, docs/kernels-collector.md), whose stepping aside for
// another CUPTI client is kept as it was measured.
//
// Rules it keeps:
//   * nothing of CUDA is linked: libcupti and libcuda are looked up at run time, and CUPTI's
//     types are declared by hand (cupti_types.h, held to the real headers by layout_check.c);
//     records are read only for a CUPTI API version whose layout was checked;
//   * the callback API's one subscriber slot is Kineto's: the collector takes it only to detach
//     CUPTI between samples (--kernels=sample, "sampling" below: from cuInit to the first
//     detach, then from each window's close to its detach), gives it up at another CUPTI
//     client's first call, and never takes it again after; cuptiFinalize only there, at a
//     CUDA runtime call's exit, as CUPTI asks;
//   * the command never waits on gpudiag: sends are non-blocking and a full socket drops the
//     batch, counted; with GPUDIAG_KERNELS_SOCKET unset, no libcupti, or gpudiag gone, it does
//     nothing and prints nothing (unless GPUDIAG_KERNELS_VERBOSE is set).
//
// Wire format (version 1; decoded by crates/kernels/src/wire.rs, which says the same). One
// SOCK_SEQPACKET message per datagram, at most 65536 bytes, little-endian, fields naturally
// aligned. Every message starts with a 16-byte header:
//   u32 magic 0x4B445047 ("GPDK"), u16 version 1, u16 type, u32 pid (getpid(), informative:
//   gpudiag takes the pid from SO_PEERCRED), u32 count (records in the message, else 0).
// Types and bodies:
//   1 HELLO     u32 parent pid, u32 CUPTI API version (0: none found), u32 collector version,
//               u32 0, u64 CUPTI ns, u64 Unix ns, u16 length, the libcupti source (UTF-8)
//   2 DEVICE    u32 CUDA ordinal, u32 1 when the UUID is known, 16 bytes of UUID
//   3 KERNELS   u64 CUPTI ns, u64 Unix ns, u32 names, u32 bytes of names, the names (each u32
//               id, u16 length, the bytes, no terminator; ids from 1, each sent once per
//               process before its first use, 0 = "the collector's name table was full"),
//               then count records of 72 bytes: u64 start, u64 end, u32 device, u32 context,
//               u32 stream, u32 name id, u32 grid x y z, u32 block x y z, u16 registers per
//               thread, u16 0, u32 shared memory bytes (static + dynamic), u32 graph id (0:
//               not a graph launch), u32 correlation id
//   4 COPIES    u64 CUPTI ns, u64 Unix ns, then count records of 48 bytes: u64 start, u64 end,
//               u32 device, u32 context, u32 stream, u32 correlation id, u64 bytes, u8 CUPTI
//               copy kind, u8 source memory kind, u8 destination memory kind, u8 flags, u32
//               graph id
//   5 SETS      u64 CUPTI ns, u64 Unix ns, then count records of 40 bytes: u64 start, u64 end,
//               u32 device, u32 context, u32 stream, u32 correlation id, u64 bytes
//   6 SYNCS     u64 CUPTI ns, u64 Unix ns, then count records of 40 bytes: u64 start, u64 end,
//               u32 context, u32 stream, u32 correlation id, u32 CUPTI synchronization type,
//               u32 CUDA event id, u32 0 (0xFFFFFFFF: the field does not apply)
//   7 LOSSES    u64 records CUPTI dropped, u64 records not sent, u64 names cut (cumulative)
//   8 ASIDE     u64 from (CUPTI ns), u64 to, u32 1 when `to` is known, u32 0: another CUPTI
//               client traced over that span; sent once, when it ended (or at exit, `to`
//               unknown, while it still traced)
//   9 CANNOT    u16 length, why (UTF-8)
//   10 GOODBYE  nothing
//   11 WINDOW   u64 from (Unix ns), u64 to (Unix ns), u32 flags, u32 0: sampling recorded from
//               `from` to `to` (flag 1: `to` is known; sent when the window opens and again when
//               it closes); flag 2: sampling gave way to another CUPTI client at `from` and
//               recording goes on in full from there
// The CUPTI ns/Unix ns pair is read at send time, one after the other, so gpudiag maps CUPTI's
// clock to the wall clock per batch. Once another client has CUPTI time records with its own
// clock, CUPTI's is carried on with CLOCK_MONOTONIC and the records are put back on it (see
// "the clock records are timed on").
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cupti_types.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the wire format is little-endian and written in host order"
#endif

#define EXPORT __attribute__((visibility("default")))

// Built on a newer glibc, dlopen, dlsym and the pthread calls would bind to their 2.34
// versions (libdl and libpthread moved into libc). The original versions are still exported by
// every glibc, so binding to them keeps the object loadable down to the binary's floor (2.28).
#if defined(__GLIBC__) && defined(__x86_64__)
#define GD_OLD_GLIBC "GLIBC_2.2.5"
#elif defined(__GLIBC__) && defined(__aarch64__)
#define GD_OLD_GLIBC "GLIBC_2.17"
#endif
#ifdef GD_OLD_GLIBC
__asm__(".symver dlopen,dlopen@" GD_OLD_GLIBC);
__asm__(".symver dlsym,dlsym@" GD_OLD_GLIBC);
__asm__(".symver pthread_create,pthread_create@" GD_OLD_GLIBC);
__asm__(".symver pthread_detach,pthread_detach@" GD_OLD_GLIBC);
__asm__(".symver dlclose,dlclose@" GD_OLD_GLIBC);
__asm__(".symver pthread_mutex_trylock,pthread_mutex_trylock@" GD_OLD_GLIBC);
#endif

enum {
  WIRE_MAGIC = 0x4B445047u,
  WIRE_VERSION = 1,
  COLLECTOR_VERSION = 1,
  MSG_HELLO = 1,
  MSG_DEVICE = 2,
  MSG_KERNELS = 3,
  MSG_COPIES = 4,
  MSG_SETS = 5,
  MSG_SYNCS = 6,
  MSG_LOSSES = 7,
  MSG_ASIDE = 8,
  MSG_CANNOT = 9,
  MSG_GOODBYE = 10,
  MSG_WINDOW = 11,
  MAX_MESSAGE = 65536,
  MAX_NAME = 1024,  // gpudiag_model::kernels::MAX_KERNEL_NAME_BYTES
};

struct wire_header {
  uint32_t magic;
  uint16_t version, type;
  uint32_t pid, count;
};
struct wire_clock {
  uint64_t cupti_ns, unix_ns;
};
struct wire_kernel {
  uint64_t start, end;
  uint32_t device, context, stream, name;
  uint32_t grid[3], block[3];
  uint16_t registers, zero;
  uint32_t shared, graph, correlation;
};
struct wire_copy {
  uint64_t start, end;
  uint32_t device, context, stream, correlation;
  uint64_t bytes;
  uint8_t copy_kind, src_kind, dst_kind, flags;
  uint32_t graph;
};
struct wire_set {
  uint64_t start, end;
  uint32_t device, context, stream, correlation;
  uint64_t bytes;
};
struct wire_sync {
  uint64_t start, end;
  uint32_t context, stream, correlation, type, event, zero;
};
_Static_assert(sizeof(struct wire_header) == 16, "header");
_Static_assert(sizeof(struct wire_kernel) == 72, "kernel");
_Static_assert(sizeof(struct wire_copy) == 48, "copy");
_Static_assert(sizeof(struct wire_set) == 40, "set");
_Static_assert(sizeof(struct wire_sync) == 40, "sync");

// The CUPTI API versions whose record layouts layout_check.c held to the real headers.
#define GD_AS_ELEMENT(v) v,
static const uint32_t checked_versions[] = {GD_CHECKED_CUPTI_VERSIONS(GD_AS_ELEMENT)};

typedef gd_result (*register_fn)(gd_buffer_request_fn, gd_buffer_complete_fn);
typedef gd_result (*kind_fn)(gd_activity_kind);
typedef gd_result (*finalize_fn)(void);
typedef gd_result (*next_record_fn)(uint8_t *, size_t, gd_activity **);
typedef gd_result (*flag_fn)(uint32_t);
typedef gd_result (*u32_out_fn)(uint32_t *);
typedef gd_result (*u64_out_fn)(uint64_t *);
typedef gd_result (*dropped_fn)(gd_cucontext, uint32_t, size_t *);
typedef gd_result (*timestamp_register_fn)(gd_timestamp_fn);
typedef gd_result (*subscribe_fn)(gd_subscriber *, gd_callback_fn, void *);
typedef gd_result (*unsubscribe_fn)(gd_subscriber);
typedef gd_result (*enable_domain_fn)(uint32_t, gd_subscriber, gd_callback_domain);

static struct {
  void *cupti;
  const char *cupti_from;
  register_fn register_callbacks;
  kind_fn enable, disable;
  finalize_fn finalize;
  next_record_fn next_record;
  flag_fn flush_all, flush_period;
  u32_out_fn version;
  u64_out_fn timestamp;
  dropped_fn dropped;
  timestamp_register_fn register_timestamp;
  subscribe_fn subscribe;
  unsubscribe_fn unsubscribe;
  enable_domain_fn enable_domain;
} real;

// Which kinds we record, and which the guest (Kineto) has enabled: a kind stays enabled in
// CUPTI while either wants it.
#define MAX_KIND 128
static const gd_activity_kind our_kinds[] = {GD_KIND_CONCURRENT_KERNEL, GD_KIND_MEMCPY,
                                             GD_KIND_MEMSET, GD_KIND_SYNCHRONIZATION};
static atomic_uchar ours_on[MAX_KIND];
static atomic_uchar guest_on[MAX_KIND];
static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int active;      // CUPTI is ours to record with
static atomic_int stopped;     // gpudiag went away, or this is a forked child
static atomic_int exiting;
static atomic_int stepped_aside;
static uint64_t aside_from_ns;
static int our_pid;
static const size_t buffer_bytes = 8u << 20;

static pthread_mutex_t guest_lock = PTHREAD_MUTEX_INITIALIZER;
static gd_buffer_request_fn guest_request;
static gd_buffer_complete_fn guest_complete;

static int verbose;
static void note(const char *what) {
  if (verbose) fprintf(stderr, "gpudiag collector[%d]: %s\n", (int)getpid(), what);
}

static void *sym(const char *name) {
  void *f = real.cupti ? dlsym(real.cupti, name) : NULL;
  return f ? f : dlsym(RTLD_NEXT, name);
}

// ---- transport ----

#define SEND_POLL_MS 5
#define SEND_PATIENCE_MS 200
static pthread_mutex_t send_lock = PTHREAD_MUTEX_INITIALIZER;
static int sock = -1;
static struct {
  uint64_t cupti_dropped, send_dropped, names_cut;
} losses, losses_sent;

static int connect_socket(void) {
  const char *path = getenv("GPUDIAG_KERNELS_SOCKET");
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (!path || !*path || strlen(path) >= sizeof addr.sun_path) return -1;
  memcpy(addr.sun_path, path, strlen(path) + 1);
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  // Bounds connect() when gpudiag's backlog is full: the command's cuInit waits at most this.
  struct timeval bound = {0, 200000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof bound);
  // As much room as the kernel grants (it caps at wmem_max without CAP_NET_ADMIN).
  int room = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void stop_recording(void);
EXPORT gd_result cuptiActivityRegisterCallbacks(gd_buffer_request_fn request,
                                                gd_buffer_complete_fn complete);

// Sends one message; 0 when it could not go (a full socket: counted by the caller).
static int send_parts(uint16_t type, uint32_t count, const void *a, size_t a_len, const void *b,
                      size_t b_len, const void *c, size_t c_len) {
  if (sock < 0) return 0;
  struct wire_header header = {WIRE_MAGIC, WIRE_VERSION, type, (uint32_t)our_pid, count};
  struct iovec parts[4] = {{&header, sizeof header},
                           {(void *)a, a_len},
                           {(void *)b, b_len},
                           {(void *)c, c_len}};
  struct msghdr msg = {.msg_iov = parts, .msg_iovlen = 4};
  // A full socket is waited on briefly: records come in bursts (a whole CUPTI buffer at a
  // time, most often on CUPTI's own thread, not the command's), larger than the socket's
  // buffer (wmem_max, about 208 KiB, caps it), and gpudiag drains them within milliseconds.
  // At most SEND_PATIENCE_MS per message, so a gpudiag that stopped reading costs the
  // command little and the batch is dropped and counted instead.
  for (int waited_ms = 0;; waited_ms += SEND_POLL_MS) {
    if (sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return 1;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOBUFS && errno != EINTR) break;
    if (waited_ms >= SEND_PATIENCE_MS) return 0;
    struct pollfd writable = {.fd = sock, .events = POLLOUT};
    poll(&writable, 1, SEND_POLL_MS);
  }
  // gpudiag is gone: recording for nobody only costs the command.
  close(sock);
  sock = -1;
  stop_recording();
  return 0;
}

static int send_simple(uint16_t type, const void *body, size_t len) {
  pthread_mutex_lock(&send_lock);
  int sent = send_parts(type, 0, body, len, NULL, 0, NULL, 0);
  pthread_mutex_unlock(&send_lock);
  return sent;
}

static void send_text(uint16_t type, const char *text, const void *prefix, size_t prefix_len) {
  size_t len = strlen(text);
  if (len > 4000) len = 4000;
  uint16_t len16 = (uint16_t)len;
  pthread_mutex_lock(&send_lock);
  if (prefix)
    send_parts(type, 0, prefix, prefix_len, &len16, sizeof len16, text, len);
  else
    send_parts(type, 0, &len16, sizeof len16, text, len, NULL, 0);
  pthread_mutex_unlock(&send_lock);
}

static void cannot_record(const char *why) {
  note(why);
  send_text(MSG_CANNOT, why, NULL, 0);
}

// ---- the clock records are timed on ----

// Kineto (torch.profiler) has CUPTI time every record with a clock of its own from its first
// trace on (cuptiActivityRegisterTimestampCallback; on Linux the CPU's time-stamp counter, in
// ticks, not ns), for the rest of the process, and cuptiGetTimestamp no longer matches the
// records. From that switch on the collector carries CUPTI's clock on with CLOCK_MONOTONIC (both
// count ns) and puts each record's times on it through the guest clock's rate, fitted from the
// switch to the buffer's completion: gpudiag sees one clock before and after, and a record's
// error is about one clock reading's, since what was recorded before the switch was flushed
// first. (A record handed over without times keeps its 0s: gpudiag counts it apart.)
static pthread_mutex_t clock_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  gd_timestamp_fn fn;          // NULL: records are on CUPTI's own clock
  uint64_t guest0, mono0;      // read together when it was registered
  int64_t cupti_minus_mono;    // at the first switch; CUPTI's clock is carried on with it
} guest_clock;

static uint64_t monotonic_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

static uint64_t unix_now_ns(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

// The guest's clock and CLOCK_MONOTONIC, read together: the closest of up to three readings,
// since a thread preempted between them (a loaded host) would skew the rate measured from two
// readings milliseconds apart by tens of percent.
static void read_both(gd_timestamp_fn fn, uint64_t *guest, uint64_t *mono) {
  uint64_t closest = UINT64_MAX;
  for (int i = 0; i < 3 && closest > 20000; i++) {
    uint64_t before = monotonic_ns();
    uint64_t g = fn();
    uint64_t after = monotonic_ns();
    if (after - before < closest) {
      closest = after - before;
      *guest = g;
      *mono = before + (after - before) / 2;
    }
  }
}

// How one completed buffer's records go onto CUPTI's clock.
struct clock_map {
  int guest;  // 0: they are on it already
  uint64_t guest_now;
  int64_t cupti_now;
  double ns_per_tick;
};

static struct clock_map clock_map_now(void) {
  struct clock_map map = {0, 0, 0, 1.0};
  pthread_mutex_lock(&clock_lock);
  gd_timestamp_fn fn = guest_clock.fn;
  uint64_t guest0 = guest_clock.guest0, mono0 = guest_clock.mono0;
  int64_t offset = guest_clock.cupti_minus_mono;
  pthread_mutex_unlock(&clock_lock);
  if (!fn) return map;
  uint64_t mono = 0;
  read_both(fn, &map.guest_now, &mono);
  map.guest = 1;
  map.cupti_now = (int64_t)mono + offset;
  if (map.guest_now > guest0 && mono > mono0)
    map.ns_per_tick = (double)(mono - mono0) / (double)(map.guest_now - guest0);
  return map;
}

static uint64_t on_cupti_clock(const struct clock_map *map, uint64_t t) {
  // 0: CUPTI could not time the record, on any clock; gpudiag says so.
  if (!map->guest || t == 0) return t;
  // Signed and small: a record is never much older than the reading, nor newer.
  double back = (double)(int64_t)(map->guest_now - t) * map->ns_per_tick;
  double v = (double)map->cupti_now - back;
  if (v <= 0) return 0;
  if (v >= 1.8e19) return UINT64_MAX;
  return (uint64_t)v;
}

static struct wire_clock clock_pair(void) {
  struct wire_clock c = {0, 0};
  pthread_mutex_lock(&clock_lock);
  int carried = guest_clock.fn != NULL;
  int64_t offset = guest_clock.cupti_minus_mono;
  pthread_mutex_unlock(&clock_lock);
  if (carried)
    c.cupti_ns = (uint64_t)((int64_t)monotonic_ns() + offset);
  else if (real.timestamp)
    real.timestamp(&c.cupti_ns);
  c.unix_ns = unix_now_ns();
  return c;
}

// ---- devices: CUDA ordinal → UUID, as NVML names the GPU ----

#define MAX_DEVICES 64
static unsigned char device_state[MAX_DEVICES];  // 0 unseen, 1 sent

typedef int (*cu_device_get_fn)(int *, int);
typedef int (*cu_device_get_uuid_fn)(unsigned char *, int);

// Resolved lazily from the buffer-completion path: InitializeInjection runs inside cuInit,
// when the driver cannot be called yet. Never at exit, when the driver may be going away.
static void announce_device(uint32_t ordinal) {
  if (ordinal >= MAX_DEVICES || device_state[ordinal]) return;
  device_state[ordinal] = 1;
  struct {
    uint32_t ordinal, known;
    unsigned char uuid[16];
  } body = {ordinal, 0, {0}};
  void *cuda = exiting ? NULL : dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!cuda && verbose)
    fprintf(stderr, "gpudiag collector[%d]: no libcuda.so.1 loaded to name CUDA device %u\n",
            (int)getpid(), ordinal);
  if (cuda) {
    cu_device_get_fn get = (cu_device_get_fn)dlsym(cuda, "cuDeviceGet");
    cu_device_get_uuid_fn uuid = (cu_device_get_uuid_fn)dlsym(cuda, "cuDeviceGetUuid_v2");
    if (!uuid) uuid = (cu_device_get_uuid_fn)dlsym(cuda, "cuDeviceGetUuid");
    int device = 0, got = get ? get(&device, (int)ordinal) : -1;
    int read = got == 0 && uuid ? uuid(body.uuid, device) : -1;
    body.known = read == 0;
    if (verbose && !body.known)
      fprintf(stderr, "gpudiag collector[%d]: no UUID for CUDA device %u (cuDeviceGet %d, UUID %d)\n",
              (int)getpid(), ordinal, got, read);
    dlclose(cuda);
  }
  send_parts(MSG_DEVICE, 0, &body, sizeof body, NULL, 0, NULL, 0);
}

// ---- kernel names, interned per process ----

#define NAME_SLOTS 16384  // filled to 3/4: at most 12 MiB of names, at 1 KiB each
static struct name_slot {
  uint64_t hash;
  char *text;
  uint16_t len;
  uint8_t sent;
} names[NAME_SLOTS];
static unsigned names_used;

static uint64_t fnv1a(const char *s, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

// The name's id (its slot + 1), or 0 when the table is full. Names are cut at MAX_NAME bytes,
// the cut ones ending in "…".
static uint32_t intern(const char *name) {
  if (!name) name = "";
  size_t len = strnlen(name, 1u << 16);
  char cut[MAX_NAME];
  int was_cut = len > MAX_NAME;
  if (was_cut) {
    size_t keep = MAX_NAME - 3;
    while (keep > 0 && ((unsigned char)name[keep] & 0xC0) == 0x80) keep--;  // whole UTF-8 only
    memcpy(cut, name, keep);
    memcpy(cut + keep, "\xE2\x80\xA6", 3);
    name = cut;
    len = keep + 3;
  }
  uint64_t h = fnv1a(name, len);
  for (unsigned probe = 0, i = (unsigned)(h % NAME_SLOTS); probe < NAME_SLOTS;
       probe++, i = (i + 1) % NAME_SLOTS) {
    struct name_slot *s = &names[i];
    if (s->text && s->hash == h && s->len == len && !memcmp(s->text, name, len)) return i + 1;
    if (!s->text) {
      if (names_used >= NAME_SLOTS * 3 / 4) return 0;
      s->text = malloc(len ? len : 1);
      if (!s->text) return 0;
      memcpy(s->text, name, len);
      s->len = (uint16_t)len;
      s->hash = h;
      s->sent = 0;
      names_used++;
      if (was_cut) losses.names_cut++;
      return i + 1;
    }
  }
  return 0;
}

// ---- batches, one per kind, sent when full and at the end of each completed buffer ----

#define NAMES_CAP 16384
#define RECORDS_CAP (MAX_MESSAGE - NAMES_CAP - 64)
static struct {
  unsigned char records[RECORDS_CAP];
  size_t used;
  uint32_t count;
} batch[4];  // kernels, copies, sets, syncs
static unsigned char name_defs[NAMES_CAP];
static size_t name_defs_used;
static uint32_t name_defs_count;
static uint32_t pending_names[NAMES_CAP / 6];

static const uint16_t batch_type[4] = {MSG_KERNELS, MSG_COPIES, MSG_SETS, MSG_SYNCS};

static void send_batch(int which) {
  if (!batch[which].count) return;
  struct wire_clock clock = clock_pair();
  int sent;
  if (which == 0) {
    uint32_t counts[2] = {name_defs_count, (uint32_t)name_defs_used};
    unsigned char head[sizeof clock + sizeof counts];
    memcpy(head, &clock, sizeof clock);
    memcpy(head + sizeof clock, counts, sizeof counts);
    sent = send_parts(MSG_KERNELS, batch[0].count, head, sizeof head, name_defs, name_defs_used,
                      batch[0].records, batch[0].used);
    // Names that did not go are sent again with the next batch that uses them.
    for (uint32_t i = 0; i < name_defs_count; i++) names[pending_names[i] - 1].sent = (uint8_t)sent;
    name_defs_used = 0;
    name_defs_count = 0;
  } else {
    sent = send_parts(batch_type[which], batch[which].count, &clock, sizeof clock,
                      batch[which].records, batch[which].used, NULL, 0);
  }
  if (!sent) losses.send_dropped += batch[which].count;
  batch[which].used = 0;
  batch[which].count = 0;
}

static void *batch_slot(int which, size_t size) {
  if (batch[which].used + size > RECORDS_CAP) send_batch(which);
  void *slot = batch[which].records + batch[which].used;
  memset(slot, 0, size);
  batch[which].used += size;
  batch[which].count++;
  return slot;
}

static uint32_t name_for_batch(const char *name) {
  uint32_t id = intern(name);
  if (!id || names[id - 1].sent) return id;
  struct name_slot *s = &names[id - 1];
  size_t need = 6 + s->len;
  if (name_defs_used + need > NAMES_CAP) send_batch(0);
  uint16_t len = s->len;
  memcpy(name_defs + name_defs_used, &id, 4);
  memcpy(name_defs + name_defs_used + 4, &len, 2);
  memcpy(name_defs + name_defs_used + 6, s->text, len);
  name_defs_used += need;
  pending_names[name_defs_count++] = id;
  s->sent = 1;  // in this batch; reset if it fails to go
  return id;
}

static uint32_t nonnegative(int32_t v) { return v < 0 ? 0 : (uint32_t)v; }

static void encode(const gd_activity *r, const struct clock_map *clock) {
#define GD_ON_CLOCK(t) on_cupti_clock(clock, (t))
  switch (r->kind) {
    case GD_KIND_CONCURRENT_KERNEL: {
      const gd_kernel *k = (const gd_kernel *)r;
      announce_device(k->deviceId);
      uint32_t name = name_for_batch(k->name);
      struct wire_kernel *w = batch_slot(0, sizeof *w);
      *w = (struct wire_kernel){GD_ON_CLOCK(k->start), GD_ON_CLOCK(k->end), k->deviceId, k->contextId, k->streamId, name,
                                {nonnegative(k->gridX), nonnegative(k->gridY), nonnegative(k->gridZ)},
                                {nonnegative(k->blockX), nonnegative(k->blockY), nonnegative(k->blockZ)},
                                k->registersPerThread, 0,
                                nonnegative(k->staticSharedMemory) + nonnegative(k->dynamicSharedMemory),
                                k->graphId, k->correlationId};
      break;
    }
    case GD_KIND_MEMCPY: {
      const gd_memcpy *m = (const gd_memcpy *)r;
      announce_device(m->deviceId);
      struct wire_copy *w = batch_slot(1, sizeof *w);
      *w = (struct wire_copy){GD_ON_CLOCK(m->start), GD_ON_CLOCK(m->end), m->deviceId, m->contextId, m->streamId,
                              m->correlationId, m->bytes, m->copyKind, m->srcKind, m->dstKind,
                              m->flags, m->graphId};
      break;
    }
    case GD_KIND_MEMSET: {
      const gd_memset *s = (const gd_memset *)r;
      announce_device(s->deviceId);
      struct wire_set *w = batch_slot(2, sizeof *w);
      *w = (struct wire_set){GD_ON_CLOCK(s->start), GD_ON_CLOCK(s->end), s->deviceId, s->contextId, s->streamId,
                             s->correlationId, s->bytes};
      break;
    }
    case GD_KIND_SYNCHRONIZATION: {
      const gd_synchronization *s = (const gd_synchronization *)r;
      struct wire_sync *w = batch_slot(3, sizeof *w);
      *w = (struct wire_sync){GD_ON_CLOCK(s->start), GD_ON_CLOCK(s->end), s->contextId, s->streamId, s->correlationId,
                              s->type, s->cudaEventId, 0};
      break;
    }
    default:
      break;
  }
#undef GD_ON_CLOCK
}

static void send_losses_if_changed(void) {
  if (!memcmp(&losses, &losses_sent, sizeof losses)) return;
  if (send_parts(MSG_LOSSES, 0, &losses, sizeof losses, NULL, 0, NULL, 0)) losses_sent = losses;
}

// ---- CUPTI's buffers ----

// The buffers we handed CUPTI. One the guest got from CUPTI before our callbacks replaced its
// own comes back to us too: it goes back to the guest whole, never to free(). At most this many
// are out at once (8 MiB each), so the process holds at most 48 MiB of them; past that CUPTI
// drops records and counts them.
#define OUTSTANDING 6

// A buffer that came back holding a record CUPTI had not timed (only a forced flush hands such
// records over) is not freed at once: CUPTI may still be finishing that record, and freeing a
// buffer a forced flush had returned corrupted a training's heap (benches/RESULTS.md, sampling).
// The last HELD_BACK such buffers wait, the oldest freed when another comes; with the 48 MiB
// above, the collector's buffers stay within 64 MiB. (send_lock held.)
#define HELD_BACK 2
static uint8_t *held_back[HELD_BACK];

static void hold_back(uint8_t *buffer) {
  free(held_back[0]);
  memmove(held_back, held_back + 1, (HELD_BACK - 1) * sizeof *held_back);
  held_back[HELD_BACK - 1] = buffer;
}

// CUPTI left the record's times 0: it had not finished it when a forced flush handed it over.
static int untimed(const gd_activity *r) {
  switch (r->kind) {
    case GD_KIND_CONCURRENT_KERNEL:
      return ((const gd_kernel *)r)->end == 0;
    case GD_KIND_MEMCPY:
      return ((const gd_memcpy *)r)->end == 0;
    case GD_KIND_MEMSET:
      return ((const gd_memset *)r)->end == 0;
    case GD_KIND_SYNCHRONIZATION:
      return ((const gd_synchronization *)r)->end == 0;
    default:
      return 0;
  }
}
static pthread_mutex_t outstanding_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *outstanding[OUTSTANDING];

enum track_op { TRACK_ADD, TRACK_FIND, TRACK_REMOVE };

static int track(uint8_t *buffer, enum track_op op) {
  pthread_mutex_lock(&outstanding_lock);
  int found = 0;
  for (int i = 0; i < OUTSTANDING && !found; i++)
    if (outstanding[i] == (op == TRACK_ADD ? NULL : buffer)) {
      if (op != TRACK_FIND) outstanding[i] = op == TRACK_ADD ? buffer : NULL;
      found = 1;
    }
  pthread_mutex_unlock(&outstanding_lock);
  return found;
}

static void buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, buffer_bytes);
  if (*buffer && !track(*buffer, TRACK_ADD)) {
    free(*buffer);
    *buffer = NULL;
  }
  *size = *buffer ? buffer_bytes : 0;
  *max_records = 0;
}

// A buffer counts as out (buffers_out) until its completion has made its last CUPTI call
// (cuptiActivityGetNextRecord, cuptiActivityGetNumDroppedRecords): CUPTI's own thread completes
// buffers, and a detach that saw none out while one was still being read could finalise CUPTI
// under that thread's calls (a race that fits a ResNet-50 training's corrupted heap;
// benches/RESULTS.md).
static void buffer_completed(gd_cucontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                             size_t valid) {
  if (!track(buffer, TRACK_FIND)) {
    pthread_mutex_lock(&guest_lock);
    gd_buffer_complete_fn complete = guest_complete;
    pthread_mutex_unlock(&guest_lock);
    if (complete) complete(ctx, stream, buffer, size, valid);
    return;
  }
  pthread_mutex_lock(&send_lock);
  int unfinished = 0;
  if (!stopped) {
    struct clock_map clock = clock_map_now();
    gd_activity *record = NULL;
    int logged = 0;
    while (real.next_record(buffer, valid, &record) == GD_CUPTI_SUCCESS) {
      unsigned kind = (unsigned)record->kind;
      unfinished |= untimed(record);
      if (verbose && !logged && kind == GD_KIND_CONCURRENT_KERNEL) {
        const gd_kernel *k = (const gd_kernel *)record;
        fprintf(stderr,
                "gpudiag collector[%d]: buffer: guest clock %d now %" PRIu64 ", CUPTI clock now %" PRId64
                " (CLOCK_MONOTONIC %" PRIu64 "), %.6f ns a tick; first kernel %" PRIu64 "..%" PRIu64
                " -> %" PRIu64 "..%" PRIu64 "\n",
                (int)getpid(), clock.guest, clock.guest_now, clock.cupti_now, monotonic_ns(),
                clock.ns_per_tick, k->start, k->end,
                on_cupti_clock(&clock, k->start), on_cupti_clock(&clock, k->end));
        logged = 1;
      }
      if (kind < MAX_KIND && ours_on[kind]) encode(record, &clock);
    }
    for (int which = 0; which < 4; which++) send_batch(which);
    size_t dropped = 0;
    if (real.dropped && real.dropped(ctx, stream, &dropped) == GD_CUPTI_SUCCESS)
      losses.cupti_dropped += dropped;
    send_losses_if_changed();
  } else {
    gd_activity *record = NULL;
    while (real.next_record(buffer, valid, &record) == GD_CUPTI_SUCCESS)
      unfinished |= untimed(record);
  }
  if (unfinished && verbose)
    fprintf(stderr, "gpudiag collector[%d]: a buffer came back holding records CUPTI had not timed\n",
            (int)getpid());
  track(buffer, TRACK_REMOVE);  // before free: the address may come back from the allocator
  if (unfinished)
    hold_back(buffer);
  else
    free(buffer);
  pthread_mutex_unlock(&send_lock);
}

// ---- recording on and off ----

static void set_kind(gd_activity_kind kind, int on) {
  if ((unsigned)kind >= MAX_KIND) return;
  ours_on[kind] = (unsigned char)on;
  if (on)
    real.enable(kind);
  else if (!guest_on[kind])
    real.disable(kind);
}

static int guest_tracing(void) {
  for (unsigned k = 0; k < MAX_KIND; k++)
    if (guest_on[k]) return 1;
  return 0;
}

static void attach(void) {
  real.register_callbacks(buffer_requested, buffer_completed);
  for (size_t i = 0; i < sizeof our_kinds / sizeof *our_kinds; i++) set_kind(our_kinds[i], 1);
  if (real.flush_period) real.flush_period(1000);
}

// ---- sampling (--kernels=sample) ----

// CUPTI instruments the launch path for as long as it is attached, whether or not a kind is on
// (turning the kinds off 90% of the time kept the whole cost: benches/RESULTS.md, the
// feasibility gate); only cuptiFinalize takes it off, and CUPTI wants that called at the exit
// of a CUDA driver or runtime call (from a thread of our own it crashed one program in three).
// So between windows the collector turns its kinds off, flushes, and lets the next runtime
// call's exit (it is subscribed to the callback API until then) call cuptiFinalize; when the next
// window opens it attaches again (CUPTI initialises itself on the next call). While detached it
// calls nothing of CUPTI's. Windows follow the wall clock (the first `on` ns of every
// `period`), so every rank of a job records the same windows.
// Another CUPTI client (Kineto subscribes to the callback API and keeps that slot, and has
// CUPTI time records with its clock; finalising would end both) ends sampling in the process:
// the collector records in full from then on, and says so (WINDOW flag 2).
static struct {
  uint64_t on_ns, period_ns;  // period 0: record all the time
} sample;
static int detached;               // CUPTI finalised until the next window (attach_lock)
static atomic_int detach_pending;  // our subscription waits for a CUDA call's exit
static gd_subscriber our_subscriber;
static int subscribed;  // our_subscriber hears the runtime API's calls (attach_lock)
static int guest_seen;        // sampling gave way to another client (attach_lock)
static uint64_t window_from;  // when the open window began, Unix ns; 0: none open (attach_lock)

// ASIDE and WINDOW: u64 from, u64 to, u32 flags, u32 0.
static void send_span(uint16_t type, uint64_t from, uint64_t to, uint32_t flags) {
  struct {
    uint64_t from, to;
    uint32_t flags, zero;
  } body = {from, to, flags, 0};
  send_simple(type, &body, sizeof body);
}

static void send_window(uint64_t from, uint64_t to, uint32_t flags) {
  send_span(MSG_WINDOW, from, to, flags);
}

static void on_cuda_call(void *userdata, gd_callback_domain domain, uint32_t cbid,
                         const void *data);

// Subscribes to the runtime API's calls, so that a detach can finalise CUPTI at one's exit;
// 0 when the slot is another client's (one we never saw call us). (attach_lock held.)
static int subscribe_to_runtime_calls(void) {
  if (subscribed) return 1;
  if (!real.subscribe || !real.enable_domain || !real.unsubscribe || !real.finalize ||
      real.subscribe(&our_subscriber, on_cuda_call, NULL) != GD_CUPTI_SUCCESS)
    return 0;
  // Runtime calls only (on_cuda_call says why): a program that makes none (the driver API
  // alone) is never detached, and pays for CUPTI between windows too.
  real.enable_domain(1, our_subscriber, GD_DOMAIN_RUNTIME_API);
  subscribed = 1;
  return 1;
}

// The slot goes back: to another client that asks for it, or as we stop. (attach_lock held.)
static void unsubscribe_from_runtime_calls(void) {
  detach_pending = 0;
  if (!subscribed) return;
  real.unsubscribe(our_subscriber);
  subscribed = 0;
}

// GPUDIAG_KERNELS_SAMPLE="ON_MS/PERIOD_MS", as gpudiag sets it; anything else records in full.
static void read_sample_schedule(void) {
  const char *spec = getenv("GPUDIAG_KERNELS_SAMPLE");
  if (!spec || !*spec) return;
  char *end = NULL;
  unsigned long long on = strtoull(spec, &end, 10);
  if (end == spec || *end != '/') return;
  const char *rest = end + 1;
  unsigned long long period = strtoull(rest, &end, 10);
  if (end == rest || *end || on == 0 || period <= on || period > 86400000ull) {
    note("GPUDIAG_KERNELS_SAMPLE is not ON_MS/PERIOD_MS: recording in full");
    return;
  }
  sample.on_ns = on * 1000000ull;
  sample.period_ns = period * 1000000ull;
}

// How many of our buffers CUPTI holds. None, after a flush with our kinds off: every record
// it made is complete and in our hands, so no kernel it instruments is still running.
static int buffers_out(void) {
  int n = 0;
  pthread_mutex_lock(&outstanding_lock);
  for (int i = 0; i < OUTSTANDING; i++) n += outstanding[i] != NULL;
  pthread_mutex_unlock(&outstanding_lock);
  return n;
}

// Flushes without FORCED until CUPTI holds none of our buffers, for at most max_ms; how many it
// still holds. With our kinds off this hands over every record CUPTI made, each one timed: a
// forced flush would hand over records it had not timed yet (and see held_back).
static int flush_until_returned(int max_ms) {
  int out = 0;
  for (int waited_ms = 0;; waited_ms += 5) {
    real.flush_all(0);
    if ((out = buffers_out()) == 0 || waited_ms >= max_ms) break;
    struct timespec settle = {0, 5000000};
    nanosleep(&settle, NULL);
  }
  return out;
}

// Our kinds off in CUPTI (ours_on keeps what we record), and everything CUPTI holds of ours
// handed over, timed; a GPU queue that does not drain in a second is handed over with a forced
// flush, its unfinished records counted by gpudiag. (attach_lock held.)
static void hand_over_ours(const char *why) {
  uint64_t before = monotonic_ns();
  for (size_t i = 0; i < sizeof our_kinds / sizeof *our_kinds; i++) real.disable(our_kinds[i]);
  int out = flush_until_returned(1000);
  if (out) real.flush_all(GD_FLUSH_FORCED);
  if (verbose)
    fprintf(stderr, "gpudiag collector[%d]: %s: our records handed over in %.3f ms%s\n",
            (int)getpid(), why, (double)(monotonic_ns() - before) / 1e6,
            out ? ", the last with a forced flush (the GPU queue had not drained)" : "");
}

// After hand_over_ours: our kinds on again. (attach_lock held.)
static void ours_back_on(void) {
  for (size_t i = 0; i < sizeof our_kinds / sizeof *our_kinds; i++)
    if (ours_on[our_kinds[i]]) real.enable(our_kinds[i]);
}

// The other client's calls, in order, for GPUDIAG_KERNELS_VERBOSE: what it did when is most of
// what explains a record lost or untimed around its traces.
static void guest_called(const char *call, long arg) {
  if (verbose)
    fprintf(stderr, "gpudiag collector[%d]: the other client calls %s(%ld)%s\n", (int)getpid(),
            call, arg, stepped_aside ? ", CUPTI handed to it" : "");
}

static void on_cuda_call(void *userdata, gd_callback_domain domain, uint32_t cbid,
                         const void *data) {
  (void)userdata;
  (void)cbid;
  if (!detach_pending || !data) return;
  // Only at the exit of a runtime call, as Kineto tears CUPTI down: a driver call is often
  // inside one (cuLaunchKernel inside cudaLaunchKernel), and finalising at its exit pulls
  // CUPTI out from under the runtime call's own exit callback: a loop of tiny kernels died of
  // SIGSEGV in two sampled runs of four (benches/RESULTS.md). A runtime call is inside no other.
  if (domain != GD_DOMAIN_RUNTIME_API) return;
  if (((const gd_callback_data *)data)->callbackSite != GD_API_EXIT) return;
  // A CUDA call of our own made under the lock (naming a GPU as a buffer completes) comes
  // here too: the next call's exit does it.
  if (pthread_mutex_trylock(&attach_lock) != 0) return;
  if (detach_pending && !guest_seen) {
    detach_pending = 0;
    if (buffers_out() > 0) {
      // CUPTI took a buffer since the window closed: not now (the sampler tries again).
      pthread_mutex_unlock(&attach_lock);
      return;
    }
    detached = 1;
    uint64_t before = monotonic_ns();
    unsubscribe_from_runtime_calls();
    gd_result finalized = real.finalize();
    if (verbose)
      fprintf(stderr, "gpudiag collector[%d]: cuptiFinalize at a CUDA call's exit: %d, %.3f ms\n",
              (int)getpid(), finalized, (double)(monotonic_ns() - before) / 1e6);
    if (finalized != GD_CUPTI_SUCCESS) {
      // Still attached with our kinds off: the cost stays, the records stop.
      note("cuptiFinalize failed: between samples CUPTI stays attached");
    }
  }
  pthread_mutex_unlock(&attach_lock);
}

// The window ends: our kinds off, what CUPTI holds handed over, then detach at the next CUDA
// call's exit. (attach_lock held.)
static void try_detach(uint64_t now);
static void close_window(uint64_t now) {
  // CUPTI stops recording, but ours_on stays: the records it still holds are ours to send.
  // (No guest has shown itself, so no kind is also another client's.)
  for (size_t i = 0; i < sizeof our_kinds / sizeof *our_kinds; i++) real.disable(our_kinds[i]);
  send_window(window_from, now, 1);
  window_from = 0;
  try_detach(now);
}

// Between windows, attached with the kinds off: detach once CUPTI's records are all in.
static void try_detach(uint64_t now) {
  // Never a forced flush here, nor a detach while a kernel CUPTI instrumented still runs: CUPTI
  // completes such a record after handing its buffer over, and detaching under running work
  // corrupted the heap of a ResNet-50 training at batch 256 (benches/RESULTS.md). Kernels
  // queued before the kinds went off finish first; a GPU queue that does not drain within
  // the wait is tried again at the sampler's next tick.
  int out = flush_until_returned(1000);
  if (verbose)
    fprintf(stderr, "gpudiag collector[%d]: window closed; %s\n", (int)getpid(),
            out ? "records still running on the GPU: detaching later" : "detaching");
  if (out) return;
  if (!subscribe_to_runtime_calls()) {
    // The slot is taken by a client we never saw call us: it keeps CUPTI as it is.
    guest_seen = 1;
    attach();
    window_from = now;
    send_window(now, 0, 2);
    note("the callback API is another client's: recording in full");
    return;
  }
  detach_pending = 1;
}

// A window opens: attach again. (attach_lock held.)
static void open_window(uint64_t now, uint32_t flags) {
  int recording = window_from != 0;
  // No runtime call since the last window closed: it never detached, but its kinds are off.
  // (The subscription stays, for this window's detach.)
  detach_pending = 0;
  if (!recording) {
    uint64_t before = monotonic_ns();
    attach();
    if (verbose)
      fprintf(stderr, "gpudiag collector[%d]: window opened (%s): attached in %.3f ms\n",
              (int)getpid(), detached ? "was detached" : "had not detached yet",
              (double)(monotonic_ns() - before) / 1e6);
  }
  detached = 0;
  if (window_from) send_window(window_from, now, 1);
  window_from = now;
  send_window(now, 0, flags);
}

// Another CUPTI client calls: sampling ends here and CUPTI stays attached for it and us.
static void give_way(void) {
  if (!sample.period_ns) return;
  pthread_mutex_lock(&attach_lock);
  if (!guest_seen) {
    guest_seen = 1;
    unsubscribe_from_runtime_calls();  // the slot is the other client's
    if (active && !stopped && !exiting && !stepped_aside) open_window(unix_now_ns(), 2);
    note("another CUPTI client: sampling ends, recording in full");
  }
  pthread_mutex_unlock(&attach_lock);
}

// Records reach gpudiag at least once a second even from a process that never fills a buffer,
// so a SIGKILLed rank loses at most its last second, and each GPU is named (by UUID) while the
// driver can still be asked. cuptiActivityFlushPeriod alone did not do it: on an H200 with CUPTI
// 13.0 a partly full buffer waited 7 s, until the next forced flush. Flushing without FORCED
// hands over only records CUPTI has completed, never one still missing its times.
// Sampling, the same thread opens and closes the windows on time.
static void *flusher(void *unused) {
  (void)unused;
  while (!stopped && !exiting) {
    uint64_t wait_ns = 1000000000u;
    if (sample.period_ns) {
      uint64_t phase = unix_now_ns() % sample.period_ns;
      uint64_t to_edge = phase < sample.on_ns ? sample.on_ns - phase : sample.period_ns - phase;
      if (to_edge + 1000000u < wait_ns) wait_ns = to_edge + 1000000u;  // just past the edge
    }
    struct timespec wait = {(time_t)(wait_ns / 1000000000u), (long)(wait_ns % 1000000000u)};
    nanosleep(&wait, NULL);
    pthread_mutex_lock(&attach_lock);
    if (active && !stepped_aside && !stopped && !exiting) {
      uint64_t now = unix_now_ns();
      int sampling = sample.period_ns && !guest_seen;
      int in_window = sampling && now % sample.period_ns < sample.on_ns;
      if (sampling && in_window && !window_from)
        open_window(now, 0);
      else if (sampling && !in_window && window_from)
        close_window(now);
      else if (sampling && !window_from && !detached && !detach_pending)
        try_detach(now);  // the GPU had not drained at the window's close
      else if (!detached && !detach_pending)
        real.flush_all(0);
    }
    pthread_mutex_unlock(&attach_lock);
  }
  return NULL;
}

static void start_flusher(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, flusher, NULL) == 0) pthread_detach(t);
}

// Turning kinds off from inside CUPTI's completion callback could re-enter CUPTI: a thread of
// its own does it.
static void *turn_off(void *unused) {
  (void)unused;
  pthread_mutex_lock(&attach_lock);
  // No detach from here on (the sampler stops too). The subscription stays, idle: changing it
  // from a thread of ours while the program may be inside a CUDA call is what crashed a
  // sampled launch loop (see InitializeInjection); another client's first call still takes it.
  detach_pending = 0;
  // Detached, there is nothing to turn off, and a call would attach CUPTI again.
  if (!stepped_aside && !detached)
    for (size_t i = 0; i < sizeof our_kinds / sizeof *our_kinds; i++) set_kind(our_kinds[i], 0);
  pthread_mutex_unlock(&attach_lock);
  return NULL;
}

static void stop_recording(void) {
  if (atomic_exchange(&stopped, 1) || !active) return;
  note("gpudiag is gone: recording stops");
  pthread_t t;
  if (pthread_create(&t, NULL, turn_off, NULL) == 0) pthread_detach(t);
}

static int version_checked(uint32_t version) {
  for (size_t i = 0; i < sizeof checked_versions / sizeof *checked_versions; i++)
    if (checked_versions[i] == version) return 1;
  return 0;
}

// The libcupti the process already has (PyTorch loads its wheel's copy: two copies in one
// process are undefined), else GPUDIAG_CUPTI, else the one the loader finds.
static int find_cupti(void) {
  static const char *sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so.11.8",
                                  "libcupti.so"};
  for (size_t i = 0; i < sizeof sonames / sizeof *sonames && !real.cupti; i++) {
    real.cupti = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD);
    if (real.cupti) real.cupti_from = "already loaded";
  }
  const char *given = getenv("GPUDIAG_CUPTI");
  if (!real.cupti && given && *given) {
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
  real.flush_all = (flag_fn)dlsym(real.cupti, "cuptiActivityFlushAll");
  real.flush_period = (flag_fn)dlsym(real.cupti, "cuptiActivityFlushPeriod");
  real.version = (u32_out_fn)dlsym(real.cupti, "cuptiGetVersion");
  real.timestamp = (u64_out_fn)dlsym(real.cupti, "cuptiGetTimestamp");
  real.dropped = (dropped_fn)dlsym(real.cupti, "cuptiActivityGetNumDroppedRecords");
  real.register_timestamp =
      (timestamp_register_fn)dlsym(real.cupti, "cuptiActivityRegisterTimestampCallback");
  real.subscribe = (subscribe_fn)dlsym(real.cupti, "cuptiSubscribe");
  real.unsubscribe = (unsubscribe_fn)dlsym(real.cupti, "cuptiUnsubscribe");
  real.enable_domain = (enable_domain_fn)dlsym(real.cupti, "cuptiEnableDomain");
  return 1;
}

static void send_aside(uint64_t from, uint64_t to, uint32_t to_known) {
  send_span(MSG_ASIDE, from, to, to_known);
}

static void goodbye(void) {
  if (getpid() != our_pid) return;  // a forked child that never exec'd: the parent says it
  exiting = 1;
  pthread_mutex_lock(&attach_lock);
  unsubscribe_from_runtime_calls();
  // Stepped aside, what CUPTI holds is the guest's to flush; detached, CUPTI holds nothing.
  if (active && !stepped_aside && !stopped && !detached) real.flush_all(GD_FLUSH_FORCED);
  int aside = stepped_aside;
  uint64_t open_from = window_from;
  window_from = 0;
  pthread_mutex_unlock(&attach_lock);
  if (aside) send_aside(aside_from_ns, 0, 0);
  if (open_from) send_window(open_from, unix_now_ns(), 1);
  pthread_mutex_lock(&send_lock);
  send_losses_if_changed();
  send_parts(MSG_GOODBYE, 0, NULL, 0, NULL, 0, NULL, 0);
  pthread_mutex_unlock(&send_lock);
}

// fork() without exec: CUDA cannot be used in the child of a process that initialised it (the
// CUDA programming guide), and CUPTI's state there is undefined, so the child records nothing.
// It closes its copy of the parent's connection, so nothing it does can be mixed into the
// parent's stream. A child that execs starts over: the environment loads us again, and its own
// cuInit connects it under its own pid. (A fork before the parent's cuInit never gets here: the
// child initialises CUDA, and so us, itself.)
static void forked_child(void) {
  pthread_mutex_init(&send_lock, NULL);
  pthread_mutex_init(&attach_lock, NULL);
  pthread_mutex_init(&guest_lock, NULL);
  pthread_mutex_init(&outstanding_lock, NULL);
  if (sock >= 0) close(sock);
  sock = -1;
  stopped = 1;
  detach_pending = 0;
}

EXPORT int InitializeInjection(void) {
  static atomic_int once;
  if (atomic_exchange(&once, 1)) return 1;
  verbose = getenv("GPUDIAG_KERNELS_VERBOSE") != NULL;
  our_pid = (int)getpid();
  sock = connect_socket();
  if (sock < 0) {
    note("no gpudiag socket: nothing recorded");
    return 1;
  }
  pthread_atfork(NULL, NULL, forked_child);
  atexit(goodbye);
  int found = find_cupti();
  uint32_t version = 0;
  if (found && real.version) real.version(&version);
  struct {
    uint32_t parent, version, collector, zero;
    struct wire_clock clock;
  } hello = {(uint32_t)getppid(), version, COLLECTOR_VERSION, 0, clock_pair()};
  send_text(MSG_HELLO, found ? real.cupti_from : "", &hello, sizeof hello);
  if (!found) {
    cannot_record("no libcupti in the process or the loader's path (set GPUDIAG_CUPTI to one)");
    return 1;
  }
  if (!real.register_callbacks || !real.enable || !real.disable || !real.next_record ||
      !real.flush_all) {
    cannot_record("this libcupti lacks the activity API");
    return 1;
  }
  if (!version_checked(version)) {
    char why[160];
    snprintf(why, sizeof why,
             "CUPTI API version %u: its record layout has not been checked by this gpudiag",
             version);
    cannot_record(why);
    return 1;
  }
  // Without LD_PRELOAD (a launcher dropped it on the way) another client's CUPTI calls would
  // bypass us: its registration would silently take our buffers and ours its, emptying its
  // trace (the naive collector of the feasibility gate did). Its trace comes first.
  // (Looked up from the program's own handle: RTLD_DEFAULT from here would search our local
  // scope too and always find us.)
  void *program = dlopen(NULL, RTLD_NOW);
  void *first = program ? dlsym(program, "cuptiActivityRegisterCallbacks") : NULL;
  if (program) dlclose(program);
  if (first != (void *)cuptiActivityRegisterCallbacks) {
    cannot_record("loaded without LD_PRELOAD (a launcher dropped it): recording could empty "
                  "another profiler's trace, so nothing is recorded");
    return 1;
  }
  // A guest that began tracing before the process's first cuInit (its calls passed through
  // us while we were not recording) keeps CUPTI: we start stood aside and take it at its
  // flush, as if we had handed it over.
  pthread_mutex_lock(&guest_lock);
  int guest_first = guest_request && guest_complete && guest_tracing();
  pthread_mutex_unlock(&guest_lock);
  read_sample_schedule();
  if (guest_first) {
    pthread_mutex_lock(&attach_lock);
    guest_seen = 1;  // no sampling: the guest holds CUPTI
    stepped_aside = 1;
    aside_from_ns = clock_pair().cupti_ns;
    active = 1;
    pthread_mutex_unlock(&attach_lock);
    start_flusher();
    note("another CUPTI client traces: standing aside until it is done");
    return 1;
  }
  if (real.register_callbacks(buffer_requested, buffer_completed) != GD_CUPTI_SUCCESS) {
    cannot_record("cuptiActivityRegisterCallbacks failed (another tool may hold CUPTI)");
    return 1;
  }
  pthread_mutex_lock(&attach_lock);
  active = 1;
  attach();
  if (sample.period_ns) {
    window_from = unix_now_ns();
    // Subscribed here, inside cuInit, where no other CUDA call is under way: subscribing
    // from the sampler's thread as the first window closed, while the program was inside a
    // CUDA call, killed a launch loop in 10 runs of 24 (SIGSEGV in that millisecond, before
    // any finalise; benches/RESULTS.md). Later windows' subscriptions, made after CUPTI was
    // attached again from that thread, never did.
    if (subscribe_to_runtime_calls()) {
      send_window(window_from, 0, 0);
    } else {
      guest_seen = 1;
      send_window(window_from, 0, 2);
      note("the callback API is another client's: recording in full");
    }
  }
  pthread_mutex_unlock(&attach_lock);
  start_flusher();
  note(sample.period_ns ? "recording, sampled" : "recording");
  return 1;
}

// ---- the guest's calls (Kineto), which reach us first through LD_PRELOAD ----

// Hands CUPTI to the guest: what ours hold is handed over to us first, whole and timed (none
// of the guest's records can land in a buffer of ours), and only the kinds the guest asked for
// stay on, so its trace holds what it asked for.
static void step_aside(void) {
  pthread_mutex_lock(&attach_lock);
  if (!stepped_aside && guest_request && guest_complete) {
    hand_over_ours("another CUPTI client starts tracing");
    for (unsigned k = 0; k < MAX_KIND; k++)
      if (ours_on[k] && guest_on[k]) real.enable((gd_activity_kind)k);
    real.register_callbacks(guest_request, guest_complete);
    stepped_aside = 1;
    aside_from_ns = clock_pair().cupti_ns;
  }
  pthread_mutex_unlock(&attach_lock);
}

// The guest's trace is over (it flushed with none of its kinds on): CUPTI comes back to us.
static void take_back(void) {
  pthread_mutex_lock(&attach_lock);
  uint64_t from = aside_from_ns, to = 0;
  int was_aside = stepped_aside;
  if (was_aside) {
    if (!stopped) attach();
    stepped_aside = 0;
    to = clock_pair().cupti_ns;
  }
  pthread_mutex_unlock(&attach_lock);
  if (was_aside) send_aside(from, to, 1);
}

EXPORT gd_result cuptiActivityRegisterCallbacks(gd_buffer_request_fn request,
                                                gd_buffer_complete_fn complete) {
  give_way();
  guest_called("cuptiActivityRegisterCallbacks", 0);
  pthread_mutex_lock(&guest_lock);
  guest_request = request;
  guest_complete = complete;
  pthread_mutex_unlock(&guest_lock);
  if (active) {
    if (stepped_aside)
      real.register_callbacks(request, complete);
    else
      step_aside();
    return GD_CUPTI_SUCCESS;
  }
  register_fn f = real.register_callbacks ? real.register_callbacks
                                          : (register_fn)sym("cuptiActivityRegisterCallbacks");
  return f ? f(request, complete) : 1;  // CUPTI_ERROR_INVALID_PARAMETER: no CUPTI at all
}

EXPORT gd_result cuptiActivityEnable(gd_activity_kind kind) {
  give_way();
  guest_called("cuptiActivityEnable", (long)kind);
  if ((unsigned)kind < MAX_KIND) guest_on[kind] = 1;
  // A guest that registered once and traces again without registering.
  if (active && !stepped_aside) step_aside();
  kind_fn f = real.enable ? real.enable : (kind_fn)sym("cuptiActivityEnable");
  return f ? f(kind) : 1;
}

EXPORT gd_result cuptiActivityDisable(gd_activity_kind kind) {
  give_way();
  guest_called("cuptiActivityDisable", (long)kind);
  if ((unsigned)kind < MAX_KIND) {
    guest_on[kind] = 0;
    if (active && !stepped_aside && ours_on[kind]) return GD_CUPTI_SUCCESS;
  }
  kind_fn f = real.disable ? real.disable : (kind_fn)sym("cuptiActivityDisable");
  return f ? f(kind) : 1;
}

// The guest flushes after it disabled its kinds: the end of its trace, so CUPTI comes back.
// Not handed CUPTI, the guest's forced flush would hand over records of ours CUPTI has not
// timed yet: ours are handed over whole first, and its flush goes on without FORCED (what it
// left with CUPTI from an earlier trace comes back to it as usual).
EXPORT gd_result cuptiActivityFlushAll(uint32_t flag) {
  give_way();
  guest_called("cuptiActivityFlushAll", (long)flag);
  flag_fn f = real.flush_all ? real.flush_all : (flag_fn)sym("cuptiActivityFlushAll");
  if (f && (flag & GD_FLUSH_FORCED)) {
    pthread_mutex_lock(&attach_lock);
    if (active && !stepped_aside && !stopped && !detached) {
      hand_over_ours("another CUPTI client's forced flush");
      ours_back_on();
      flag &= ~(uint32_t)GD_FLUSH_FORCED;
    }
    pthread_mutex_unlock(&attach_lock);
  }
  gd_result result = f ? f(flag) : 1;
  if (stepped_aside && !guest_tracing()) take_back();
  return result;
}

// The guest times CUPTI's records with its own clock from now on (Kineto does, as its first
// trace starts): what we hold was timed on the clock in force and goes first, then the switch
// is noted so later records are put back on CUPTI's clock (see clock_map_now). Kineto registers
// the same clock again as each later trace starts, and CUPTI then hands over the records it
// held without times (50 matmuls between two traces, on an H200): ours go first then too.
EXPORT gd_result cuptiActivityRegisterTimestampCallback(gd_timestamp_fn fn) {
  give_way();
  guest_called("cuptiActivityRegisterTimestampCallback", 0);
  timestamp_register_fn f = real.register_timestamp
                                ? real.register_timestamp
                                : (timestamp_register_fn)sym("cuptiActivityRegisterTimestampCallback");
  if (!f) return 1;
  pthread_mutex_lock(&attach_lock);
  pthread_mutex_lock(&clock_lock);
  int same = guest_clock.fn == fn;
  pthread_mutex_unlock(&clock_lock);
  int recording = active && !stepped_aside && !stopped && !detached;
  if (recording) hand_over_ours("another CUPTI client's clock");
  struct wire_clock before = clock_pair();
  uint64_t mono_before = monotonic_ns();
  gd_result result = f(fn);
  if (result == GD_CUPTI_SUCCESS && !same) {
    pthread_mutex_lock(&clock_lock);
    // CUPTI's clock is carried on from the first switch; before CUPTI was found (a guest that
    // traced before cuInit), nothing was timed yet and CLOCK_MONOTONIC is the clock.
    if (!guest_clock.fn && fn)
      guest_clock.cupti_minus_mono = before.cupti_ns ? (int64_t)(before.cupti_ns - mono_before) : 0;
    guest_clock.fn = fn;
    if (fn) read_both(fn, &guest_clock.guest0, &guest_clock.mono0);
    if (verbose)
      fprintf(stderr,
              "gpudiag collector[%d]: another client's clock: it reads %" PRIu64
              " at CLOCK_MONOTONIC %" PRIu64 "; CUPTI's read %" PRIu64 " at %" PRIu64 "\n",
              (int)getpid(), guest_clock.guest0, guest_clock.mono0, before.cupti_ns, mono_before);
    pthread_mutex_unlock(&clock_lock);
  }
  if (recording) ours_back_on();
  pthread_mutex_unlock(&attach_lock);
  return result;
}

// The guest finalises CUPTI when a trace ends (Kineto's TEARDOWN_CUPTI): that would end our
// recording too. Its records are flushed to it first, as finalising would have done.
EXPORT gd_result cuptiFinalize(void) {
  give_way();
  guest_called("cuptiFinalize", 0);
  if (stepped_aside) take_back();
  if (active) {
    real.flush_all(GD_FLUSH_FORCED);
    return GD_CUPTI_SUCCESS;
  }
  finalize_fn f = real.finalize ? real.finalize : (finalize_fn)sym("cuptiFinalize");
  return f ? f() : 1;
}

// Kineto subscribes to the callback API when torch.profiler first starts, and keeps the slot:
// sampling must not hold it then, nor finalise CUPTI under Kineto afterwards.
EXPORT gd_result cuptiSubscribe(gd_subscriber *subscriber, gd_callback_fn callback,
                                void *userdata) {
  give_way();
  guest_called("cuptiSubscribe", 0);
  subscribe_fn f = real.subscribe ? real.subscribe : (subscribe_fn)sym("cuptiSubscribe");
  return f ? f(subscriber, callback, userdata) : 1;
}
