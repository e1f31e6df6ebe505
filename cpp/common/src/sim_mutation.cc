#include "mooncake_cxl/common/sim_mutation.h"

#include <cstdlib>
#include <cstring>

#include "mooncake_cxl/common/log.h"

namespace mcxl {

namespace sim_mutation_detail {
std::atomic<uint32_t> g_active{0};
}  // namespace sim_mutation_detail

namespace {

SimMutation ParseSimMutation() {
  const char* v = getenv("MC_CXL_SIM_MUTATE");
  if (v == nullptr || *v == 0) return SimMutation::kNone;
  struct Name {
    const char* name;
    SimMutation m;
  };
  static constexpr Name kNames[] = {{"drop_publish_writeback", SimMutation::kDropPublishWriteback},
                                    {"drop_read_invalidate", SimMutation::kDropReadInvalidate},
                                    {"drop_ring_invalidate", SimMutation::kDropRingInvalidate}};
  for (const Name& n : kNames)
    if (strcmp(v, n.name) == 0) {
      MCXL_LOG(kWarn, "sim", "MC_CXL_SIM_MUTATE=%s: a test-only mutation of the non-coherent discipline is active", v);
      return n.m;
    }
  MCXL_LOG(kWarn, "sim", "MC_CXL_SIM_MUTATE=%s is not a mutation (drop_publish_writeback, drop_read_invalidate, "
           "drop_ring_invalidate); none applied", v);
  return SimMutation::kNone;
}

}  // namespace

void LoadSimMutation(bool noncoherent) {
  static const SimMutation parsed = ParseSimMutation();  // once per process: one log line
  sim_mutation_detail::g_active.store(uint32_t(noncoherent ? parsed : SimMutation::kNone), std::memory_order_relaxed);
}

}  // namespace mcxl
