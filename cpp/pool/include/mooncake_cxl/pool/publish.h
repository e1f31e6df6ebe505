// The one helper for every cross-process publish and observe (docs/architecture.md §7).
//
// Contract: a writer that stores plain bytes another process will read calls
// PublishRange on them before the release store that announces them; a reader
// calls ObserveRange before reading plain bytes another process announced.
// Nothing else in the code base issues flushes or fences for pool data.
//
// Three builds of the same calls, chosen once at attach (SetCoherenceMode,
// from the superblock's coherence_mode) and never changed while pool data is
// in use:
//   coherent (one host, CXL 3.x back-invalidate): a release / acquire fence.
//   real non-coherent (shared CXL without cross-host coherence): PublishRange
//     writes back each line (clwb; clflushopt, else clflush, where the CPU
//     lacks clwb: CPUID at the first use) then sfence; ObserveRange evicts
//     each line (clflushopt, else clflush: a dirty line is written back
//     first) then mfence, so the loads that follow fetch from memory.
//   simulated (MC_CXL_SIM_HOST set, coherence_sim.h): the same two
//     operations on this process's simulated host copy of the pool.
// WriteBackRange / InvalidateRange are the line operations without the
// release / acquire fence, for a caller that orders them itself (several
// ranges, one fence); the real build still ends each with its sfence /
// mfence, which completes the range's lines.
// A range may start and end anywhere: every line it touches is covered.
//
// Cost in coherent mode: one relaxed load of a process-wide word and a
// never-taken branch beside the fence (the fence is free on x86 for
// release/acquire: a compiler barrier).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "mooncake_cxl/common/sim_mutation.h"
#include "mooncake_cxl/pool/layout.h"

namespace mcxl {

// Process-wide; set once when the pool is attached. kNonCoherent selects the
// simulator when this process maps a simulated host copy (MC_CXL_SIM_HOST),
// else the real cache-line instructions.
void SetCoherenceMode(CoherenceMode mode);
CoherenceMode GetCoherenceMode();

// Which build of the primitives runs (diagnostics, tests, the bench).
enum class LinePath : uint32_t { kFences = 0, kCacheLineOps = 1, kSimulated = 2 };
LinePath GetLinePath();
// The real instruction writing lines back: "clwb", "clflushopt" or "clflush".
const char* WriteBackInstruction();

// The real instructions whatever this process's build (the Pool's own
// writes before the process chose its build): write back + sfence, evict +
// mfence.
void CacheLineWriteBack(const void* p, size_t n);
void CacheLineEvict(const void* p, size_t n);

namespace publish_detail {
// Relaxed: written once at attach, before this process touches pool data;
// process-local (each host process picks its own build).
extern std::atomic<uint32_t> g_line_path;
void WriteBackSlow(const void* p, size_t n);
void InvalidateSlow(const void* p, size_t n);
inline bool LineOpsOn() {
  return __builtin_expect(g_line_path.load(std::memory_order_relaxed) != 0, 0);
}
}  // namespace publish_detail

// GetCoherenceMode() == kNonCoherent, inline: a line build other than the
// fences runs exactly on a non-coherent pool.
inline bool NonCoherentMode() { return publish_detail::LineOpsOn(); }

// Write back [p, p+n) to the pool without a fence (no-op when coherent).
inline void WriteBackRange(const void* p, size_t n) {
  if (publish_detail::LineOpsOn()) publish_detail::WriteBackSlow(p, n);
}
// Invalidate [p, p+n) without a fence: a dirty line is written back first,
// then the next load fetches the pool's bytes (no-op when coherent).
inline void InvalidateRange(const void* p, size_t n) {
  if (publish_detail::LineOpsOn()) publish_detail::InvalidateSlow(p, n);
}

inline void PublishRange(const void* p, size_t n) {
  WriteBackRange(p, n);  // ends with sfence in the real build
  // Release: the announcing store that follows cannot pass the data stores.
  std::atomic_thread_fence(std::memory_order_release);
}

inline void ObserveRange(const void* p, size_t n) {
  InvalidateRange(p, n);  // ends with mfence in the real build
  // Acquire: the data loads that follow cannot move before the observing load.
  std::atomic_thread_fence(std::memory_order_acquire);
}

// PublishRange / ObserveRange whose line operations the test-only mutation
// `m` drops (sim_mutation.h): checked only where line operations run, so
// the coherent build is the plain fence.
inline void PublishRangeUnless(SimMutation m, const void* p, size_t n) {
  if (publish_detail::LineOpsOn() && !SimMutated(m)) publish_detail::WriteBackSlow(p, n);
  std::atomic_thread_fence(std::memory_order_release);
}
inline void ObserveRangeUnless(SimMutation m, const void* p, size_t n) {
  if (publish_detail::LineOpsOn() && !SimMutated(m)) publish_detail::InvalidateSlow(p, n);
  std::atomic_thread_fence(std::memory_order_acquire);
}

}  // namespace mcxl
