// Holds: "blocks announced to a consumer stay until it has loaded them or a
// deadline passes" (mooncake_cxl.kv), built on the lease word every reader
// already raises (master_eviction.cc: a live lease protects an object from
// eviction and from unforced removes). A hold is a lease to a deadline:
//   * no master round trip, no new state: the producer raises the lease, the
//     consumer lowers it after loading;
//   * bounded: the deadline (at most kMaxHoldNs ahead) passes by itself, so a
//     dead or slow consumer never holds the pool for longer;
//   * not counted: two holders of one object share one word, so a release
//     by one leaves the other protected only for a read lease's ttl (enough
//     for a consumer already loading; a later one finds the blocks or falls
//     back to a lookup, as for any hint).
//
// Atomics: the lease word is a relaxed hint compared with the clock
// (object_index.cc); the entry is found under its seqlock (FindComplete) and
// re-checked after the write, so a hold landing on a slot the master reused
// meanwhile is reported as OBJECT_NOT_FOUND (the stray lease it left lapses
// at the deadline). A release checks before and after its write and undoes
// it on a reused slot (LowerLeaseOf): it never shortens another object's hold.
// On a non-coherent pool both are kLeases items the master applies
// (client_noncoherent.cc): one round trip per call there.
#include <algorithm>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl {

std::vector<ErrorCode> Client::ForEachLocated(const std::vector<std::string_view>& keys,
                                              const std::function<ErrorCode(const EntrySnapshot&)>& act) {
  std::vector<BatchKey> ks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) PrepareLookup(keys[i], "get", &ks[i]);
  std::vector<ErrorCode> out(keys.size(), ErrorCode::OK);
  std::shared_lock<std::shared_mutex> lock(life_mu_);  // once for the batch
  if (closed_ || pool_->failed()) {
    out.assign(keys.size(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
    return out;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!ks[i].ok) {
      out[i] = ErrorCode::INVALID_PARAMS;
      continue;
    }
    auto snap = index_->FindComplete(ks[i].stored, ks[i].hash);
    out[i] = snap ? act(*snap) : snap.error();
  }
  return out;
}

std::vector<ErrorCode> Client::HoldLeases(const std::vector<std::string_view>& keys, uint64_t until_ns) {
  const uint64_t until = std::min(until_ns, NowNs() + kMaxHoldNs);
  if (until_ns > until)
    MCXL_LOG(kInfo, "client", "hold of %zu key(s): deadline clamped to %llu s ahead", keys.size(),
             (unsigned long long)(kMaxHoldNs / 1000000000ull));
  if (NonCoherent()) return HoldByMaster(keys, until, false);
  return ForEachLocated(keys, [&](const EntrySnapshot& snap) {
    index_->ExtendLease(snap.slot, until);
    return index_->StillValid(snap) ? ErrorCode::OK : ErrorCode::OBJECT_NOT_FOUND;
  });
}

std::vector<ErrorCode> Client::HoldByMaster(const std::vector<std::string_view>& keys, uint64_t until_ns,
                                            bool lower) {
  // A non-coherent pool: the entry's one writer, the master, applies them
  // to the located objects (kLeases), checking each is still that object.
  std::vector<ErrorCode> out(keys.size(), ErrorCode::OK);
  std::vector<LeaseItem> items;
  std::vector<size_t> at;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto snap = Locate(keys[i]);
    if (!snap) {
      out[i] = snap.error();
      continue;
    }
    items.push_back({snap->slot, snap->state_gen, until_ns, lower});
    at.push_back(i);
  }
  std::vector<int32_t> rc = SendLeases(items);
  for (size_t j = 0; j < at.size(); ++j) out[at[j]] = ErrorCode(rc[j]);
  return out;
}

std::vector<ErrorCode> Client::ReleaseLeases(const std::vector<std::string_view>& keys) {
  const uint64_t to = NowNs() + LeaseTtlNs();
  if (NonCoherent()) return HoldByMaster(keys, to, true);
  // Only the object located: a slot reused since (removed, put again) keeps
  // the new object's lease (LowerLeaseOf re-checks around the write).
  return ForEachLocated(keys, [&](const EntrySnapshot& snap) {
    return index_->LowerLeaseOf(snap, to) ? ErrorCode::OK : ErrorCode::OBJECT_NOT_FOUND;
  });
}

}  // namespace mcxl
