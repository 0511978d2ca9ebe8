// Holds cupti_types.h to the real CUPTI headers: every field the collector reads must sit at
// the offset the CUPTI release's own record type has. Compiled, never run:
// `scripts/check-cupti-layout INCLUDE_DIR...` builds it once per CUPTI include directory, and a
// failed _Static_assert names the field that moved. The record type of each activity kind is
// the one that CUPTI release fills; a release whose API version is outside the ranges below
// stops the check with #error, and one that checks out but that collector.c does not accept
// yet says so, so a new CUPTI is looked at before the collector is told to accept it.
#include <cupti_activity.h>
#include <cupti_callbacks.h>
#include <cupti_version.h>
#include <stddef.h>

#include "cupti_types.h"

// The record each kind's records are in, by the API version's range (cupti_activity.h names
// it at each CUpti_ActivityKind).
#if CUPTI_API_VERSION >= 130400 && CUPTI_API_VERSION < 130600
typedef CUpti_ActivityKernel13 real_kernel;
typedef CUpti_ActivityMemcpy7 real_memcpy;
typedef CUpti_ActivityMemset5 real_memset;
typedef CUpti_ActivitySynchronization2 real_sync;
#elif CUPTI_API_VERSION >= 130300 && CUPTI_API_VERSION < 130400
typedef CUpti_ActivityKernel12 real_kernel;
typedef CUpti_ActivityMemcpy6 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization2 real_sync;
#elif CUPTI_API_VERSION >= 130100 && CUPTI_API_VERSION < 130300
typedef CUpti_ActivityKernel11 real_kernel;
typedef CUpti_ActivityMemcpy6 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization2 real_sync;
#elif CUPTI_API_VERSION >= 130000 && CUPTI_API_VERSION < 130100
typedef CUpti_ActivityKernel10 real_kernel;
typedef CUpti_ActivityMemcpy6 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization2 real_sync;
#elif CUPTI_API_VERSION >= 26 && CUPTI_API_VERSION <= 28
typedef CUpti_ActivityKernel9 real_kernel;
typedef CUpti_ActivityMemcpy6 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization2 real_sync;
#elif CUPTI_API_VERSION >= 20 && CUPTI_API_VERSION <= 24
typedef CUpti_ActivityKernel9 real_kernel;
typedef CUpti_ActivityMemcpy5 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization real_sync;
#elif CUPTI_API_VERSION == 18
// 11.8, 12.0 and 12.1 all say 18: 11.8 fills Kernel8, 12.0 and 12.1 Kernel9. Both have the
// fields read at the same offsets (checked against each release's headers), so Kernel8, which
// every one of them declares, stands for both here.
typedef CUpti_ActivityKernel8 real_kernel;
typedef CUpti_ActivityMemcpy5 real_memcpy;
typedef CUpti_ActivityMemset4 real_memset;
typedef CUpti_ActivitySynchronization real_sync;
#else
#error "a CUPTI API version whose record layouts gpudiag has not looked at: add its record types here"
#endif

// And collector.c accepts it: a version checked here but not listed there records nothing.
#define GD_IS_THIS_VERSION(v) || CUPTI_API_VERSION == v
_Static_assert(0 GD_CHECKED_CUPTI_VERSIONS(GD_IS_THIS_VERSION),
               "this CUPTI API version is not in GD_CHECKED_CUPTI_VERSIONS (cupti_types.h): "
               "once this check passes, add it there");

#define SAME(ours, real, field)                                                         \
  _Static_assert(offsetof(ours, field) == offsetof(real, field), #real "." #field " moved"); \
  _Static_assert(sizeof(((ours *)0)->field) == sizeof(((real *)0)->field),              \
                 #real "." #field " changed size")

SAME(gd_activity, CUpti_Activity, kind);

SAME(gd_kernel, real_kernel, kind);
SAME(gd_kernel, real_kernel, registersPerThread);
SAME(gd_kernel, real_kernel, start);
SAME(gd_kernel, real_kernel, end);
SAME(gd_kernel, real_kernel, deviceId);
SAME(gd_kernel, real_kernel, contextId);
SAME(gd_kernel, real_kernel, streamId);
SAME(gd_kernel, real_kernel, gridX);
SAME(gd_kernel, real_kernel, gridY);
SAME(gd_kernel, real_kernel, gridZ);
SAME(gd_kernel, real_kernel, blockX);
SAME(gd_kernel, real_kernel, blockY);
SAME(gd_kernel, real_kernel, blockZ);
SAME(gd_kernel, real_kernel, staticSharedMemory);
SAME(gd_kernel, real_kernel, dynamicSharedMemory);
SAME(gd_kernel, real_kernel, correlationId);
SAME(gd_kernel, real_kernel, name);
SAME(gd_kernel, real_kernel, graphNodeId);
SAME(gd_kernel, real_kernel, graphId);

SAME(gd_memcpy, real_memcpy, kind);
SAME(gd_memcpy, real_memcpy, copyKind);
SAME(gd_memcpy, real_memcpy, srcKind);
SAME(gd_memcpy, real_memcpy, dstKind);
SAME(gd_memcpy, real_memcpy, flags);
SAME(gd_memcpy, real_memcpy, bytes);
SAME(gd_memcpy, real_memcpy, start);
SAME(gd_memcpy, real_memcpy, end);
SAME(gd_memcpy, real_memcpy, deviceId);
SAME(gd_memcpy, real_memcpy, contextId);
SAME(gd_memcpy, real_memcpy, streamId);
SAME(gd_memcpy, real_memcpy, correlationId);
SAME(gd_memcpy, real_memcpy, graphId);

SAME(gd_memset, real_memset, kind);
SAME(gd_memset, real_memset, bytes);
SAME(gd_memset, real_memset, start);
SAME(gd_memset, real_memset, end);
SAME(gd_memset, real_memset, deviceId);
SAME(gd_memset, real_memset, contextId);
SAME(gd_memset, real_memset, streamId);
SAME(gd_memset, real_memset, correlationId);
SAME(gd_memset, real_memset, graphId);

SAME(gd_synchronization, real_sync, kind);
SAME(gd_synchronization, real_sync, type);
SAME(gd_synchronization, real_sync, start);
SAME(gd_synchronization, real_sync, end);
SAME(gd_synchronization, real_sync, correlationId);
SAME(gd_synchronization, real_sync, contextId);
SAME(gd_synchronization, real_sync, streamId);
SAME(gd_synchronization, real_sync, cudaEventId);

// The enum values collector.c uses by number.
_Static_assert(GD_KIND_MEMCPY == CUPTI_ACTIVITY_KIND_MEMCPY, "memcpy kind");
_Static_assert(GD_KIND_MEMSET == CUPTI_ACTIVITY_KIND_MEMSET, "memset kind");
_Static_assert(GD_KIND_CONCURRENT_KERNEL == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, "kernel kind");
_Static_assert(GD_KIND_SYNCHRONIZATION == CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, "sync kind");
_Static_assert(GD_FLUSH_FORCED == CUPTI_ACTIVITY_FLAG_FLUSH_FORCED, "forced flush");
_Static_assert(GD_CUPTI_SUCCESS == CUPTI_SUCCESS, "success");
_Static_assert(GD_SYNC_INVALID == CUPTI_SYNCHRONIZATION_INVALID_VALUE, "invalid sync value");
_Static_assert(sizeof(gd_activity_kind) == sizeof(CUpti_ActivityKind), "kind size");
_Static_assert(sizeof(gd_result) == sizeof(CUptiResult), "result size");
// The callback API, used only to detach CUPTI between samples.
SAME(gd_callback_data, CUpti_CallbackData, callbackSite);
_Static_assert(GD_API_EXIT == CUPTI_API_EXIT, "API exit site");
_Static_assert(GD_DOMAIN_DRIVER_API == CUPTI_CB_DOMAIN_DRIVER_API &&
                   GD_DOMAIN_RUNTIME_API == CUPTI_CB_DOMAIN_RUNTIME_API,
               "callback domains");
_Static_assert(sizeof(gd_callback_domain) == sizeof(CUpti_CallbackDomain), "domain size");
_Static_assert(sizeof(uint32_t) == sizeof(CUpti_CallbackId), "callback id size");
// The wire's copy and sync codes are CUPTI's own numbers (decoded in src/wire.rs).
_Static_assert(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD == 1 && CUPTI_ACTIVITY_MEMCPY_KIND_DTOH == 2 &&
                   CUPTI_ACTIVITY_MEMCPY_KIND_DTOD == 8 && CUPTI_ACTIVITY_MEMCPY_KIND_HTOH == 9 &&
                   CUPTI_ACTIVITY_MEMCPY_KIND_PTOP == 10,
               "copy kinds");
_Static_assert(CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE == 1 && CUPTI_ACTIVITY_MEMORY_KIND_PINNED == 2 &&
                   CUPTI_ACTIVITY_MEMORY_KIND_DEVICE == 3 &&
                   CUPTI_ACTIVITY_MEMORY_KIND_MANAGED == 5,
               "memory kinds");
_Static_assert(CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE == 1 &&
                   CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT == 2 &&
                   CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE == 3 &&
                   CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE == 4,
               "sync types");

// CUPTI_API_VERSION of this header, for the script to print.
const unsigned checked_cupti_api_version = CUPTI_API_VERSION;
