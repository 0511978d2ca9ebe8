// The few CUPTI and CUDA driver types the collector reads, declared by hand so gpudiag builds
// without a CUDA toolkit. Only the leading fields of each activity record that the collector
// reads are declared; a record is always reached through cuptiActivityGetNextRecord, which knows
// the real size, so the trailing fields (which grow with CUPTI versions) never matter.
//
// Every offset here is held to the real headers by layout_check.c (scripts/check-cupti-layout).
// Checked, with identical offsets for every field below: CUPTI 11.8 (API 18, Kernel8), 12.0 and
// 12.1 (API 18), 12.2 (20), 12.3 (21), 12.4 (22), 12.5 (23), 12.6 (24), 12.8 (26), 12.9 (28),
// 13.0 (130001), 13.1 (130101), 13.2 (130202), 13.3 (130301), 13.4 (130401), 13.5 (130500):
// the kernel record of each (Kernel8 to Kernel13), Memcpy5 to 7, Memset4 and 5,
// Synchronization and Synchronization2. collector.c accepts exactly those API versions.
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

#endif
