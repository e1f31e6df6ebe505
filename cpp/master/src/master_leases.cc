// Leases on a non-coherent pool (docs/architecture.md §7): there a client
// never writes an index entry, whose line has the master as its one writer.
// A client's read leases, kv holds and releases arrive as kLeases items
// naming (entry slot, state_gen); the master applies each only to that
// object (same state_gen, readable) and answers OBJECT_NOT_FOUND for one
// that changed. Raises are a max, capped at the longest hold; lowers never
// go below the item's deadline.
//
// Atomics follow the three rules stated in master_impl.h; the lease word is
// written here by the master's own host only (readers of a non-coherent
// pool do not CAS it), so the CAS in ExtendLease/LowerLease is host-local.
#include <algorithm>

#include "master_impl.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl {

int32_t MasterImpl::ApplyLease(const LeaseItem& it, uint64_t now) {
  if (it.entry_slot >= index_->capacity()) return ToInt(ErrorCode::OBJECT_NOT_FOUND);
  EntrySnapshot s;
  if (!index_->ReadEntry(it.entry_slot, &s) || s.state_gen != it.state_gen || !Readable(s.state()))
    return ToInt(ErrorCode::OBJECT_NOT_FOUND);
  if (it.lower) index_->LowerLease(it.entry_slot, it.until_ns);
  else index_->ExtendLease(it.entry_slot, std::min(it.until_ns, now + kMaxLeaseHoldNs));
  return 0;
}

std::string MasterImpl::HandleLeases(Decoder* d) {
  return FoldBatch<LeasesRequest, PublishReply>(
      d, "Leases", "entries", [](const LeasesRequest& r) { return r.items.size(); },
      [&](const LeasesRequest& req, PublishReply* reply) {
        uint64_t now = NowNs();
        reply->results.reserve(req.items.size());
        for (const LeaseItem& it : req.items) reply->results.push_back(ApplyLease(it, now));
      });
}

}  // namespace mcxl
