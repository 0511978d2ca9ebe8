// Runs the collector as the CUDA driver would, against fake_cupti.c: loads it, calls
// InitializeInjection, and then does what argv[2] says.
//   init      nothing more
//   records N fake_emit(N) once
//   guest     a second CUPTI client (as Kineto) registers and traces, then stops; prints how
//             many records reached it
//   guest-clock  the same, the client first having CUPTI time records with a clock of its own
//             (as Kineto's TSC: 3 ticks a ns, far from CUPTI's), as Kineto does
//   fork      forks; the child emits and exits, the parent emits after it
//   guest-first  the second client traces from before InitializeInjection, then stops
//   guest-held  as guest, CUPTI still holding a buffer of ours when the second client starts
//   gone      waits for a line on stdin (gpudiag goes away meanwhile), emits, and says whether
//             the kernel kind is still on
//   sample N  for N ms, a CUDA call every 5 ms and a kernel whenever the kernel kind is on;
//             prints in how many of the steps it was on and how often CUPTI was finalised
//   sample-guest N  the same, and halfway a second client subscribes (as Kineto does)
//   flood N NAMES SECONDS [nccl]  N kernels of NAMES names a buffer at a time, spread evenly
//             over SECONDS (0: as fast as they go), for benches/kernels_memory.py
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cupti_types.h"

static size_t guest_records;
static void guest_callback(void *userdata, gd_callback_domain domain, uint32_t cbid,
                           const void *data) {
  (void)userdata;
  (void)domain;
  (void)cbid;
  (void)data;
}
static uint64_t guest_ticks(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return 3 * ((uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec) + 77777777777ull;
}
static void guest_request(uint8_t **buffer, size_t *size, size_t *max) {
  *buffer = malloc(1 << 20);
  *size = 1 << 20;
  *max = 0;
}
static void guest_complete(gd_cucontext c, uint32_t s, uint8_t *buffer, size_t size,
                           size_t valid) {
  (void)c;
  (void)s;
  (void)size;
  guest_records += valid / 256;
  free(buffer);
}

int main(int argc, char **argv) {
  if (argc < 3) return 2;
  // DRIVER_LOCAL: loaded as a library nobody else's symbols resolve to, as the CUDA driver
  // loads it when LD_PRELOAD did not load it first.
  int scope = getenv("DRIVER_LOCAL") ? RTLD_LOCAL : RTLD_GLOBAL;
  void *collector = dlopen(argv[1], RTLD_NOW | scope);
  if (!collector) {
    fprintf(stderr, "%s\n", dlerror());
    return 3;
  }
  int (*init)(void) = (int (*)(void))dlsym(collector, "InitializeInjection");
  gd_result (*reg)(gd_buffer_request_fn, gd_buffer_complete_fn) =
      (gd_result(*)(gd_buffer_request_fn, gd_buffer_complete_fn))dlsym(
          collector, "cuptiActivityRegisterCallbacks");
  gd_result (*enable)(gd_activity_kind) =
      (gd_result(*)(gd_activity_kind))dlsym(collector, "cuptiActivityEnable");
  gd_result (*disable)(gd_activity_kind) =
      (gd_result(*)(gd_activity_kind))dlsym(collector, "cuptiActivityDisable");
  gd_result (*flush)(uint32_t) = (gd_result(*)(uint32_t))dlsym(collector, "cuptiActivityFlushAll");
  gd_result (*finalize)(void) = (gd_result(*)(void))dlsym(collector, "cuptiFinalize");
  gd_result (*set_clock)(gd_timestamp_fn) = (gd_result(*)(gd_timestamp_fn))dlsym(
      collector, "cuptiActivityRegisterTimestampCallback");
  if (!strcmp(argv[2], "guest-first")) {
    // Loaded after the collector, so its calls pass through to this one, as to a libcupti.
    if (!dlopen(getenv("GPUDIAG_CUPTI"), RTLD_NOW | RTLD_GLOBAL)) return 4;
    reg(guest_request, guest_complete);
    enable(GD_KIND_CONCURRENT_KERNEL);
  }
  printf("init %d\n", init());
  fflush(stdout);
  if (!strcmp(argv[2], "init")) return 0;
  void *fake = dlopen(getenv("GPUDIAG_CUPTI"), RTLD_NOW | RTLD_NOLOAD);
  if (!fake) return 4;
  int (*emit)(int) = (int (*)(int))dlsym(fake, "fake_emit");
  int (*enabled)(int) = (int (*)(int))dlsym(fake, "fake_enabled");
  if (!strcmp(argv[2], "flood") && argc > 5) {
    int (*flood)(int, int, long, int) = (int (*)(int, int, long, int))dlsym(fake, "fake_flood");
    long total = atol(argv[3]), done = 0;
    int names = atoi(argv[4]), nccl = argc > 6 && !strcmp(argv[6], "nccl");
    double seconds = atof(argv[5]);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (done < total) {
      int n = flood(total - done > 1000000 ? 1000000 : (int)(total - done), names, done, nccl);
      if (n <= 0) return 5;
      done += n;
      // On schedule: this many kernels by now.
      double due = seconds * (double)done / (double)total;
      clock_gettime(CLOCK_MONOTONIC, &now);
      double ahead = due - ((double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9);
      if (ahead > 0) {
        struct timespec wait = {(time_t)ahead, (long)((ahead - (double)(time_t)ahead) * 1e9)};
        nanosleep(&wait, NULL);
      }
    }
    printf("flooded %ld\n", done);
    return 0;
  }
  if (!strcmp(argv[2], "records")) {
    printf("emitted %d\n", emit(argc > 3 ? atoi(argv[3]) : 1));
    return 0;
  }
  if (!strcmp(argv[2], "guest-first")) {
    emit(5);  // the guest's
    disable(GD_KIND_CONCURRENT_KERNEL);
    flush(0);
    emit(2);  // ours
    printf("guest got %zu\n", guest_records);
    return 0;
  }
  if (!strcmp(argv[2], "guest-held")) {
    int (*hold)(int) = (int (*)(int))dlsym(fake, "fake_hold");
    printf("held %d\n", hold(3));  // ours, not yet handed over
    reg(guest_request, guest_complete);
    enable(GD_KIND_CONCURRENT_KERNEL);
    emit(5);  // the guest's
    disable(GD_KIND_CONCURRENT_KERNEL);
    flush(1);  // forced, as Kineto flushes at its trace's end
    emit(2);   // ours again
    printf("guest got %zu\n", guest_records);
    return 0;
  }
  if (!strcmp(argv[2], "guest") || !strcmp(argv[2], "guest-clock")) {
    emit(3);  // ours
    if (!strcmp(argv[2], "guest-clock")) set_clock(guest_ticks);
    reg(guest_request, guest_complete);
    enable(GD_KIND_CONCURRENT_KERNEL);
    // The guest's kinds only: our memcpy kind went off when it took CUPTI.
    printf("while aside: kernel kind %d, memcpy kind %d\n", enabled(GD_KIND_CONCURRENT_KERNEL),
           enabled(GD_KIND_MEMCPY));
    emit(5);  // the guest's
    disable(GD_KIND_CONCURRENT_KERNEL);
    flush(0);
    // Kineto's TEARDOWN_CUPTI: must not end our recording.
    finalize();
    printf("after: kernel kind %d, memcpy kind %d\n", enabled(GD_KIND_CONCURRENT_KERNEL),
           enabled(GD_KIND_MEMCPY));
    emit(2);  // ours again
    printf("guest got %zu\n", guest_records);
    return 0;
  }
  if (!strcmp(argv[2], "sample") || !strcmp(argv[2], "sample-guest")) {
    void (*call)(void) = (void (*)(void))dlsym(fake, "fake_cuda_call");
    int (*finalizations)(void) = (int (*)(void))dlsym(fake, "fake_finalizations");
    gd_result (*subscribe)(gd_subscriber *, gd_callback_fn, void *) =
        (gd_result(*)(gd_subscriber *, gd_callback_fn, void *))dlsym(collector, "cuptiSubscribe");
    int steps = (argc > 3 ? atoi(argv[3]) : 1000) / 5, on = 0, on_late = 0, late = 0;
    int guest_result = -1;
    for (int i = 0; i < steps; i++) {
      if (!strcmp(argv[2], "sample-guest") && i == steps / 2) {
        gd_subscriber handle;
        guest_result = subscribe(&handle, guest_callback, NULL);
      }
      call();
      if (enabled(GD_KIND_CONCURRENT_KERNEL)) {
        on++;
        if (i > steps / 2 + 20) on_late++;
        emit(1);
      }
      if (i > steps / 2 + 20) late++;
      usleep(5000);
    }
    printf("on %d of %d, late %d of %d, finalised %d, guest subscribed %d\n", on, steps,
           on_late, late, finalizations(), guest_result);
    int (*inside)(void) = (int (*)(void))dlsym(fake, "fake_finalized_inside_a_call");
    printf("finalised inside a runtime call %d\n", inside());
    int (*off_thread)(void) =
        (int (*)(void))dlsym(fake, "fake_subscribed_off_thread_before_a_finalize");
    printf("subscribed from another thread before the first finalise %d\n", off_thread());
    return 0;
  }
  if (!strcmp(argv[2], "gone")) {
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 5;
    emit(1);
    for (int i = 0; i < 100 && enabled(GD_KIND_CONCURRENT_KERNEL); i++) usleep(10000);
    printf("kernel kind %d\n", enabled(GD_KIND_CONCURRENT_KERNEL));
    return 0;
  }
  if (!strcmp(argv[2], "fork")) {
    pid_t child = fork();
    if (child == 0) {
      emit(4);
      exit(0);
    }
    waitpid(child, NULL, 0);
    emit(1);
    return 0;
  }
  return 2;
}
