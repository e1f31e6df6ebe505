// One-sided reads: every read runs the loop of read_loop.h (locate under
// the entry's seqlock, act, re-check the entry's version, retry a torn
// copy); this file holds its copy step, the single-key and batch reads that
// drive it, and the sinks that say where a value goes.
//
// Atomics: as stated at the top of client.cc.
#include "mooncake_cxl/client/client.h"

#include <algorithm>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/doorbell.h"
#include "client_internal.h"
#include "read_loop.h"

namespace mcxl {

namespace {
// Caller slices that receive the whole value (get_into, batch reads).
class SliceSink final : public ReadSink {
 public:
  SliceSink(const MutSlice* dsts, size_t ndsts) : dsts_(dsts), ndsts_(ndsts) {}
  Status Place(uint64_t, ReadDest* dest) override {
    dest->slices = dsts_;
    dest->nslices = ndsts_;
    return ErrorCode::OK;
  }

 private:
  const MutSlice* dsts_;
  size_t ndsts_;
};

// Ranges of the value (get_into_ranges): each range's result is its size,
// or INVALID_PARAMS when it does not lie inside the value located.
class RangeSink final : public ReadSink {
 public:
  RangeSink(const std::vector<RangeCopy>& ranges, std::vector<int64_t>* out) : ranges_(ranges), out_(out) {}
  Status Place(uint64_t size, ReadDest* dest) override {
    for (size_t i = 0; i < ranges_.size(); ++i) {
      const RangeCopy& r = ranges_[i];
      bool inside = r.src_offset <= size && r.size <= size - r.src_offset;
      (*out_)[i] = inside ? int64_t(r.size) : ToInt(ErrorCode::INVALID_PARAMS);
    }
    dest->ranges = ranges_.data();
    dest->nranges = ranges_.size();
    return ErrorCode::OK;
  }

 private:
  const std::vector<RangeCopy>& ranges_;
  std::vector<int64_t>* out_;
};
}  // namespace

Result<EntrySnapshot> Client::Locate(std::string_view key) {
  std::string buf;
  std::string_view stored;
  if (!ScopeKey(key, "get", &buf, &stored)) return ErrorCode::INVALID_PARAMS;
  return LocateStored(stored);
}

Result<EntrySnapshot> Client::LocateStored(std::string_view key) {
  GateScope entered(read_gate_);
  if (!entered.ok() || pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  return index_->FindComplete(key, KeyHash(key));
}

Result<bool> Client::CopyStep(const EntrySnapshot& snap, std::string_view key, ReadSink& sink) {
  ReadDest dest;
  Status placed = sink.Place(snap.value_size, &dest);
  if (!placed.ok()) return placed.error();
  if (dest.ranges == nullptr && TotalSize(dest.slices, dest.nslices) < snap.value_size) {
    MCXL_LOG(kWarn, "client", "get of '%.*s': buffer of %llu bytes is smaller than the value (%llu)",
             int(key.size()), key.data(), (unsigned long long)TotalSize(dest.slices, dest.nslices),
             (unsigned long long)snap.value_size);
    return ErrorCode::INVALID_PARAMS;
  }
  return CopyLocked(snap, key, dest);
}

Result<bool> Client::CopyLocked(const EntrySnapshot& snap, std::string_view key, const ReadDest& dest) {
  if (snap.state() == EntryState::kOnDisk) return CopyFromDisk(snap, key, dest);
  if (snap.state() == EntryState::kInSegment) return CopyFromSegment(snap, key, dest);
  const char* src = index_->ValuePtr(snap, key);
  if (src == nullptr) return false;  // geometry of a stale snapshot: retry
  ObserveRangeUnless(SimMutation::kDropReadInvalidate, src, snap.value_size);
  CopyOut(src, snap.value_size, dest);
  // After the copy: a SIGBUS mid-copy replaced pages with zeros (kRemap).
  if (pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  return index_->StillValid(snap);
}

Result<uint64_t> Client::GetScoped(std::string_view user_key, const char* op, ReadSink& sink) {
  std::string buf;
  std::string_view key;
  if (!ScopeKey(user_key, op, &buf, &key)) return ErrorCode::INVALID_PARAMS;
  GateScope entered(read_gate_);
  if (!entered.ok()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  ReadTally tally;
  auto size = ReadLoop(key, KeyHash(key), nullptr, 0, &tally,
                       [&](const EntrySnapshot& s) { return CopyStep(s, key, sink); });
  RecordReads(tally.hits, tally.misses);
  return size;
}

Result<uint64_t> Client::Get(std::string_view key, ReadSink& sink) { return GetScoped(key, "get", sink); }

Result<uint64_t> Client::GetInto(std::string_view key, const MutSlice* dsts, size_t ndsts) {
  SliceSink sink(dsts, ndsts);
  return GetScoped(key, "get", sink);
}

void Client::RecordRead(bool hit) { RecordReads(hit ? 1 : 0, hit ? 0 : 1); }

void Client::RecordReads(uint64_t hits, uint64_t misses) {
  ClientSlot* cs = pool_->client_slot(slot_.load(std::memory_order_relaxed));
  // Relaxed: statistics; only this client writes the line.
  if (hits != 0) {
    cs->get_hits.fetch_add(hits, std::memory_order_relaxed);
    PublishRange(&cs->get_hits, sizeof(uint64_t));
  }
  if (misses != 0) {
    cs->get_misses.fetch_add(misses, std::memory_order_relaxed);
    PublishRange(&cs->get_misses, sizeof(uint64_t));
  }
}

void Client::BatchGetInto(const std::vector<std::string_view>& user_keys, const std::vector<MutSlice>& dsts,
                          const std::vector<size_t>& first, std::vector<int64_t>* out) {
  size_t n = user_keys.size();
  std::vector<BatchKey> keys(n);
  // Pass 1: scope and hash every key and start loading its home index entry.
  for (size_t i = 0; i < n; ++i) {
    if ((*out)[i] != 0) continue;  // refused by the caller
    PrepareLookup(user_keys[i], "get", &keys[i]);
    if (!keys[i].ok) (*out)[i] = ToInt(ErrorCode::INVALID_PARAMS);
  }
  std::shared_lock<std::shared_mutex> lock(life_mu_);  // once for the batch
  if (closed_ || pool_->failed()) {
    for (size_t i = 0; i < n; ++i)
      if ((*out)[i] == 0) (*out)[i] = ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
    return;
  }
  // Pass 2: locate every key (one snapshot each) and start loading the
  // first lines of its value. A lease and a clock read for the whole batch.
  uint64_t lease_until = NowNs() + LeaseTtlNs();
  std::vector<EntrySnapshot> snaps(n);
  std::vector<char> located(n, 0);
  ReadTally tally;
  for (size_t i = 0; i < n; ++i) {
    if ((*out)[i] != 0) continue;
    auto snap = index_->FindComplete(keys[i].stored, keys[i].hash);
    if (!snap) {
      if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) ++tally.misses;
      (*out)[i] = ToInt(snap.error());
      continue;
    }
    snaps[i] = *snap;
    located[i] = 1;
    if (const char* src = index_->ValuePtr(*snap, keys[i].stored)) __builtin_prefetch(src);
  }
  // Pass 3: the read loop of each key, starting from its snapshot.
  for (size_t i = 0; i < n; ++i) {
    if (!located[i]) continue;
    SliceSink sink(dsts.data() + first[i], first[i + 1] - first[i]);
    std::string_view key = keys[i].stored;
    auto size = ReadLoop(key, keys[i].hash, &snaps[i], lease_until, &tally,
                         [&](const EntrySnapshot& s) { return CopyStep(s, key, sink); });
    (*out)[i] = size ? int64_t(*size) : int64_t(ToInt(size.error()));
  }
  RecordReads(tally.hits, tally.misses);  // one counter update per batch
}

void Client::PrepareLookup(std::string_view key, const char* op, BatchKey* k) const {
  k->ok = ScopeKey(key, op, &k->buf, &k->stored);
  if (!k->ok) return;
  k->hash = KeyHash(k->stored);
  __builtin_prefetch(&index_->entry(index_->HomeSlot(k->hash)));
}

std::vector<int> Client::BatchIsExist(const std::vector<std::string_view>& keys) {
  const uint64_t lease_until = NowNs() + LeaseTtlNs();  // one clock read for the batch
  auto found = ForEachLocated(keys, [&](const EntrySnapshot& snap) {
    RaiseLease(snap, lease_until);  // queued for the master on a non-coherent pool
    return ErrorCode::OK;
  });
  std::vector<int> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    out[i] = found[i] == ErrorCode::OK ? 1 : found[i] == ErrorCode::OBJECT_NOT_FOUND ? 0 : ToInt(found[i]);
  return out;
}

int Client::IsExist(std::string_view key) {
  auto snap = Locate(key);
  if (snap.ok()) {
    RaiseLease(*snap, NowNs() + LeaseTtlNs());
    return 1;
  }
  return snap.error() == ErrorCode::OBJECT_NOT_FOUND ? 0 : ToInt(snap.error());
}

Result<uint64_t> Client::GetSize(std::string_view key) {
  auto snap = Locate(key);
  if (!snap) return snap.error();
  RaiseLease(*snap, NowNs() + LeaseTtlNs());  // as the reference does
  return snap->value_size;
}

std::vector<int64_t> Client::GetRanges(std::string_view key, const std::vector<RangeCopy>& ranges) {
  std::vector<int64_t> out(ranges.size(), 0);
  RangeSink sink(ranges, &out);
  auto r = GetScoped(key, "get_into_ranges", sink);
  if (!r) out.assign(ranges.size(), ToInt(r.error()));
  return out;
}

}  // namespace mcxl
