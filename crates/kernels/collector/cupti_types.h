// The few CUPTI and CUDA driver types the collector reads, declared by hand so gpudiag builds
// without a CUDA toolkit. Only the leading fields of each activity record that the collector
// reads are declared; a record is always reached through cuptiActivityGetNextRecord, which knows
// the real size, so the trailing fields (which grow with CUPTI versions) never matter.
//
// Every offset here is held to the real headers by layout_check.c (scripts/check-cupti-layout),
// checked against the headers of the NVIDIA pip wheels of CUPTI 11.8, 12.0 to 12.6, 12.8, 12.9
// and 13.0 to 13.5, first releases and updates (their API versions are listed below): the
// fields below sit at the same offsets in the record each of them fills (Kernel8 to Kernel13,
// Memcpy5 to 7, Memset4 and 5, Synchronization and Synchronization2).
#ifndef GPUDIAG_CUPTI_TYPES_H
#define GPUDIAG_CUPTI_TYPES_H

#include <stddef.h>
#include <stdint.h>

// CUPTI's records are packed and 8-byte aligned (cupti_common.h: PACKED_ALIGNMENT).
#define GD_PACKED __attribute__((__packed__)) __attribute__((aligned(8)))

typedef int gd_result;  // CUptiResult
#define GD_CUPTI_SUCCESS 0

typedef int gd_activity_kind;  // CUpti_ActivityKind
#define GD_KIND_MEMCPY 1
#define GD_KIND_MEMSET 2
#define GD_KIND_CONCURRENT_KERNEL 10
#define GD_KIND_SYNCHRONIZATION 38

#define GD_FLUSH_FORCED 1  // CUPTI_ACTIVITY_FLAG_FLUSH_FORCED

// The CUPTI API versions (cuptiGetVersion) whose headers layout_check.c was compiled against;
// collector.c records only for these. 18 is 11.8, 12.0 and 12.1; 27 is 12.9's first release,
// 28 its update; 13.x says 13MMUU (130000 is 13.0, 130001 its update).
#define GD_CHECKED_CUPTI_VERSIONS(X)                                                        \
  X(18) X(20) X(21) X(22) X(23) X(24) X(26) X(27) X(28) X(130000) X(130001) X(130100)      \
  X(130101) X(130200) X(130201) X(130202) X(130300) X(130301) X(130400) X(130401) X(130500)

typedef void *gd_cucontext;  // CUcontext

typedef struct GD_PACKED {
  gd_activity_kind kind;
} gd_activity;

// CUpti_ActivityKernel8 … CUpti_ActivityKernel13, up to graphId.
typedef struct GD_PACKED {
  gd_activity_kind kind;
  uint8_t cacheConfig;
  uint8_t sharedMemoryConfig;
  uint16_t registersPerThread;
  int32_t partitionedGlobalCacheRequested;
  int32_t partitionedGlobalCacheExecuted;
  uint64_t start;
  uint64_t end;
  uint64_t completed;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  int32_t gridX;
  int32_t gridY;
  int32_t gridZ;
  int32_t blockX;
  int32_t blockY;
  int32_t blockZ;
  int32_t staticSharedMemory;
  int32_t dynamicSharedMemory;
  uint32_t localMemoryPerThread;
  uint32_t localMemoryTotal;
  uint32_t correlationId;
  int64_t gridId;
  const char *name;
  void *reserved0;
  uint64_t queued;
  uint64_t submitted;
  uint8_t launchType;
  uint8_t isSharedMemoryCarveoutRequested;
  uint8_t sharedMemoryCarveoutRequested;
  uint8_t padding;
  uint32_t sharedMemoryExecuted;
  uint64_t graphNodeId;
  int32_t shmemLimitConfig;
  uint32_t graphId;
} gd_kernel;

// CUpti_ActivityMemcpy5 … CUpti_ActivityMemcpy7, up to graphId.
typedef struct GD_PACKED {
  gd_activity_kind kind;
  uint8_t copyKind;
  uint8_t srcKind;
  uint8_t dstKind;
  uint8_t flags;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t correlationId;
  uint32_t runtimeCorrelationId;
  uint32_t pad;
  void *reserved0;
  uint64_t graphNodeId;
  uint32_t graphId;
} gd_memcpy;

// CUpti_ActivityMemset4 and CUpti_ActivityMemset5, up to graphId.
typedef struct GD_PACKED {
  gd_activity_kind kind;
  uint32_t value;
  uint64_t bytes;
  uint64_t start;
  uint64_t end;
  uint32_t deviceId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t correlationId;
  uint16_t flags;
  uint16_t memoryKind;
  uint32_t pad;
  void *reserved0;
  uint64_t graphNodeId;
  uint32_t graphId;
} gd_memset;

// CUpti_ActivitySynchronization and CUpti_ActivitySynchronization2, up to cudaEventId.
typedef struct GD_PACKED {
  gd_activity_kind kind;
  uint32_t type;  // CUpti_ActivitySynchronizationType
  uint64_t start;
  uint64_t end;
  uint32_t correlationId;
  uint32_t contextId;
  uint32_t streamId;
  uint32_t cudaEventId;
} gd_synchronization;

// CUPTI_SYNCHRONIZATION_INVALID_VALUE: the field does not apply to this record.
#define GD_SYNC_INVALID 0xFFFFFFFFu

typedef void (*gd_buffer_request_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*gd_buffer_complete_fn)(gd_cucontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid);
// CUpti_TimestampCallbackFunc: a clock another client has CUPTI time every record with.
typedef uint64_t (*gd_timestamp_fn)(void);

// The callback API, used only to detach CUPTI between samples (collector.c, "sampling").
typedef void *gd_subscriber;  // CUpti_SubscriberHandle
typedef int gd_callback_domain;  // CUpti_CallbackDomain
#define GD_DOMAIN_DRIVER_API 1
#define GD_DOMAIN_RUNTIME_API 2
// CUpti_CallbackFunc; for the driver and runtime domains `data` is a CUpti_CallbackData, whose
// first field is the call site.
typedef void (*gd_callback_fn)(void *userdata, gd_callback_domain domain, uint32_t cbid,
                               const void *data);
typedef struct {
  int callbackSite;  // CUpti_ApiCallbackSite
} gd_callback_data;
#define GD_API_EXIT 1  // CUPTI_API_EXIT

#endif
