// Test-only mutations of the non-coherent discipline (docs/architecture.md
// §7): MC_CXL_SIM_MUTATE names one write-back or invalidate to drop, so a
// test can show that the coherence simulator (MC_CXL_SIM_HOST) catches its
// absence. Read once per process, at its first pool attach or use; unset
// (every production run) nothing is dropped. A process with a mutation
// logs it once.
//   drop_publish_writeback  the write-back of a put's value before its publish
//   drop_read_invalidate    the invalidate of a value's lines before a get copies them
//   drop_ring_invalidate    the invalidate of a ring record's body before it is read
#pragma once

#include <cstdint>

namespace mcxl {

enum class SimMutation : uint32_t { kNone = 0, kDropPublishWriteback, kDropReadInvalidate, kDropRingInvalidate };

// The mutation in force (parsed from the environment on first call).
SimMutation ActiveSimMutation();

inline bool SimMutated(SimMutation m) {
  static const SimMutation active = ActiveSimMutation();  // once per process
  return active == m;
}

}  // namespace mcxl
