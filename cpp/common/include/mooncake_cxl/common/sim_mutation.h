// Test-only mutations of the non-coherent discipline (docs/architecture.md
// §7): MC_CXL_SIM_MUTATE names one write-back or invalidate to drop, so a
// test can show that the coherence simulator (MC_CXL_SIM_HOST) catches its
// absence. Read at attach of a non-coherent pool only (SetCoherenceMode);
// unset, or a coherent pool, nothing is dropped; the call sites check it
// only where line operations run (publish.h PublishRangeUnless), so the
// coherent build pays nothing. A process with a mutation logs it once.
//   drop_publish_writeback  the write-back of a put's value before its publish
//   drop_read_invalidate    the invalidate of a value's lines before a get copies them
//   drop_ring_invalidate    the invalidate of a ring record's body before it is read
#pragma once

#include <atomic>
#include <cstdint>

namespace mcxl {

enum class SimMutation : uint32_t { kNone = 0, kDropPublishWriteback, kDropReadInvalidate, kDropRingInvalidate };

// Sets the mutation in force: MC_CXL_SIM_MUTATE's when `noncoherent`
// (parsed once per process), else none.
void LoadSimMutation(bool noncoherent);

namespace sim_mutation_detail {
// Relaxed: written at attach, before this process touches pool data;
// process-local.
extern std::atomic<uint32_t> g_active;
}  // namespace sim_mutation_detail

inline bool SimMutated(SimMutation m) {
  return __builtin_expect(sim_mutation_detail::g_active.load(std::memory_order_relaxed) == uint32_t(m), 0);
}

}  // namespace mcxl
