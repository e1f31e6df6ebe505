// The one locate-act-revalidate loop of the client's one-sided reads (get,
// get_into, batch reads, ranges, pinned views); not a public header.
//
// Contract: with life_mu_ held shared (or read_gate_ entered) and the key already scoped, each
// attempt takes a seqlock snapshot of the key's entry (FindComplete), hands
// it to the step (a copy that re-checks the entry, or a pin), and either
// finishes or, when the entry changed under the step, locates the key again.
// Only this loop extends the lease of a read and classifies it: a hit when
// the step finished, a miss when the key is not found; a step's error ends
// the read uncounted. After kReadRetries changed attempts the key is treated
// as gone (it was rewritten every time).
//
// Atomics: none of its own; FindComplete and the step's re-check are the
// seqlock (object_index.h), the lease word a relaxed hint.
#pragma once

#include <immintrin.h>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/clock.h"

namespace mcxl {

// How often a one-sided read retries a step that a concurrent writer tore.
constexpr int kReadRetries = 1000;

template <class Step>
Result<uint64_t> Client::ReadLoop(std::string_view stored, uint64_t hash, const EntrySnapshot* first,
                                  uint64_t lease_until_ns, ReadTally* tally, Step&& step) {
  calls_seen_.Note();
  EntrySnapshot located;
  for (int attempt = 0; attempt < kReadRetries; ++attempt) {
    const EntrySnapshot* snap = first;
    if (attempt > 0 || first == nullptr) {
      if (attempt > 0) _mm_pause();
      if (pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
      auto found = index_->FindComplete(stored, hash);
      if (!found) {
        if (found.error() == ErrorCode::OBJECT_NOT_FOUND) ++tally->misses;
        return found.error();
      }
      located = *found;
      snap = &located;
    }
    Result<bool> done = step(*snap);
    if (!done) return done.error();
    if (*done) {
      RaiseLease(*snap, lease_until_ns != 0 ? lease_until_ns : NowNs() + LeaseTtlNs());
      ++tally->hits;
      return snap->value_size;
    }
  }
  return ErrorCode::OBJECT_NOT_FOUND;
}

}  // namespace mcxl
