// Capacity limits of the Kunlun XPU3 kernels, shared by the kernels (kernel/*.xpu), their
// wrappers (wrapper/*.cpp, which assert them before a launch) and the emulator (emu/),
// which enforces the memory sizes. One definition each; nothing repeats these numbers.
#pragma once

#include <cstdint>

namespace fdmtp {
namespace xpu {

// Local memory (LM) per XPU core. 8 KB is the per-core LM of the Kunlun KP programming
// model as documented for XPU2; we assume no more on XPU3 (P800), the conservative choice
// (no Kunlun SDK or manual is available to us to confirm the XPU3 figure).
constexpr int64_t kLocalMemBytes = 8 * 1024;
// Shared memory (SM) per cluster: FastDeploy's XPU3 wrappers size their shared buffers
// from 256 * 1024 bytes (speculate_get_logits.cpp: `256 * 1024 / sizeof(int) / 5`).
constexpr int64_t kSharedMemBytes = 256 * 1024;
// Cores per cluster: FastDeploy launches its XPU3 MTP kernels with 64 cores per cluster.
constexpr int kMaxCoresPerCluster = 64;
// Default launch shape: 12 clusters x 64 cores, as upstream's mtp_free_and_dispatch_block.
constexpr int kDefaultClusters = 12;
constexpr int kDefaultCores = 64;

// Ops that keep per-item prefix sums in shared memory (the row gathers,
// speculate_get_logits, speculate_pre_process, draft_model_update) accept at most this
// many items: two int64 arrays of kMaxBatch + 1 entries fit beside the per-core partials.
constexpr int64_t kMaxBatch = 8192;
// The n-gram ops keep one 16-byte proposal and one count per item in shared memory.
constexpr int64_t kMaxNgramBatch = 8192;
// Widest draft row draft_model_postprocess stages in local memory (K + 1 slots).
constexpr int64_t kMaxDraftWidth = 128;
// Bytes per GM -> LM -> GM bounce when kernels copy or zero rows.
constexpr int64_t kCopyChunkBytes = 2048;

// Shared memory used by the prefix-sum kernels (checked in the kernels with static_assert).
constexpr int64_t kScanSharedBytes = 2 * (kMaxBatch + 1) * 8 + (kMaxCoresPerCluster + 1) * 8;
static_assert(kScanSharedBytes <= kSharedMemBytes, "prefix-sum buffers exceed shared memory");
constexpr int64_t kNgramSharedBytes = kMaxNgramBatch * (16 + 4) + (kMaxCoresPerCluster + 1) * 8;
static_assert(kNgramSharedBytes <= kSharedMemBytes, "n-gram buffers exceed shared memory");

}  // namespace xpu
}  // namespace fdmtp
