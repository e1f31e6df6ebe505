// One-sided reads: locate the key in the index under the entry's seqlock,
// check the object header, extend the lease, copy, and re-check the entry's
// version; a changed version means the copy may be torn and is retried.
//
// Atomics: as stated at the top of client.cc.
#include "mooncake_cxl/client/client.h"

#include <immintrin.h>
#include <algorithm>
#include <cstring>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/doorbell.h"
#include "client_internal.h"

namespace mcxl {

Result<EntrySnapshot> Client::Locate(std::string_view key) {
  std::string buf;
  std::string_view stored;
  if (!ScopeKey(key, "get", &buf, &stored)) return ErrorCode::INVALID_PARAMS;
  return LocateStored(stored);
}

Result<EntrySnapshot> Client::LocateStored(std::string_view key) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_ || pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  return index_->FindComplete(key, KeyHash(key));
}

Result<bool> Client::CopyValidated(const EntrySnapshot& snap, std::string_view key, const MutSlice* dsts,
                                   size_t ndsts) {
  std::string buf;
  std::string_view stored;
  if (!ScopeKey(key, "get", &buf, &stored)) return ErrorCode::INVALID_PARAMS;
  return CopyStored(snap, stored, dsts, ndsts);
}

Result<bool> Client::CopyStored(const EntrySnapshot& snap, std::string_view key, const MutSlice* dsts,
                                size_t ndsts) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  return CopyLocked(snap, key, dsts, ndsts, NowNs() + LeaseTtlNs());
}

Result<bool> Client::CopyLocked(const EntrySnapshot& snap, std::string_view key, const MutSlice* dsts, size_t ndsts,
                                uint64_t lease_until_ns) {
  if (TotalSize(dsts, ndsts) < snap.value_size) return ErrorCode::INVALID_PARAMS;
  if (snap.state() == EntryState::kOnDisk) return CopyFromDisk(snap, key, dsts, ndsts);
  const char* src = index_->ValuePtr(snap, key);
  if (src == nullptr) return false;  // geometry of a stale snapshot: retry
  ObserveRange(src, snap.value_size);
  ScatterTo(src, snap.value_size, dsts, ndsts);
  // After the copy: a SIGBUS mid-copy replaced pages with zeros (kRemap).
  if (pool_->failed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (!index_->StillValid(snap)) return false;
  index_->ExtendLease(snap.slot, lease_until_ns);
  return true;
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
  struct Key {
    std::string buf;
    std::string_view stored;
    uint64_t hash = 0;
  };
  std::vector<Key> keys(n);
  // Pass 1: scope and hash every key and start loading its home index entry,
  // so that the lookups below overlap their cache misses.
  for (size_t i = 0; i < n; ++i) {
    if ((*out)[i] != 0) continue;  // refused by the caller
    Key& k = keys[i];
    if (!ScopeKey(user_keys[i], "get", &k.buf, &k.stored)) {
      (*out)[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    k.hash = KeyHash(k.stored);
    __builtin_prefetch(&index_->entry(index_->HomeSlot(k.hash)));
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
  uint64_t hits = 0, misses = 0;
  for (size_t i = 0; i < n; ++i) {
    if ((*out)[i] != 0) continue;
    auto snap = index_->FindComplete(keys[i].stored, keys[i].hash);
    if (!snap) {
      if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) ++misses;
      (*out)[i] = ToInt(snap.error());
      continue;
    }
    snaps[i] = *snap;
    located[i] = 1;
    if (const char* src = index_->ValuePtr(*snap, keys[i].stored)) __builtin_prefetch(src);
  }
  // Pass 3: copy and validate each; a key whose entry changed since its
  // snapshot is looked up again, as GetInto does.
  for (size_t i = 0; i < n; ++i) {
    if (!located[i]) continue;
    const MutSlice* d = dsts.data() + first[i];
    size_t nd = first[i + 1] - first[i];
    std::string_view key = keys[i].stored;
    if (TotalSize(d, nd) < snaps[i].value_size) {
      MCXL_LOG(kWarn, "client", "get of '%.*s': buffer of %llu bytes is smaller than the value (%llu)",
               int(key.size()), key.data(), (unsigned long long)TotalSize(d, nd),
               (unsigned long long)snaps[i].value_size);
      (*out)[i] = ToInt(ErrorCode::INVALID_PARAMS);
      continue;
    }
    EntrySnapshot snap = snaps[i];
    int64_t result = ToInt(ErrorCode::OBJECT_NOT_FOUND);  // rewritten on every attempt: treat as gone
    for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
      if (attempt > 0) {
        _mm_pause();
        auto again = index_->FindComplete(key, keys[i].hash);
        if (!again) {
          if (again.error() == ErrorCode::OBJECT_NOT_FOUND) ++misses;
          result = ToInt(again.error());
          break;
        }
        snap = *again;
        if (TotalSize(d, nd) < snap.value_size) {
          result = ToInt(ErrorCode::INVALID_PARAMS);
          break;
        }
      }
      auto ok = CopyLocked(snap, key, d, nd, lease_until);
      if (!ok) {
        result = ToInt(ok.error());
        break;
      }
      if (*ok) {
        ++hits;
        result = int64_t(snap.value_size);
        break;
      }
    }
    (*out)[i] = result;
  }
  RecordReads(hits, misses);  // one counter update per batch
}

Result<uint64_t> Client::GetInto(std::string_view user_key, const MutSlice* dsts, size_t ndsts) {
  std::string buf;
  std::string_view key;
  if (!ScopeKey(user_key, "get", &buf, &key)) return ErrorCode::INVALID_PARAMS;
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = LocateStored(key);
    if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
    if (!snap) return snap.error();
    if (TotalSize(dsts, ndsts) < snap->value_size) {
      MCXL_LOG(kWarn, "client", "get of '%.*s': buffer of %llu bytes is smaller than the value (%llu)",
               int(key.size()), key.data(), (unsigned long long)TotalSize(dsts, ndsts),
               (unsigned long long)snap->value_size);
      return ErrorCode::INVALID_PARAMS;
    }
    auto ok = CopyStored(*snap, key, dsts, ndsts);
    if (!ok) return ok.error();
    if (*ok) {
      RecordRead(true);
      return snap->value_size;
    }
    _mm_pause();
  }
  return ErrorCode::OBJECT_NOT_FOUND;  // rewritten on every attempt: treat as gone
}

int Client::IsExist(std::string_view key) {
  auto snap = Locate(key);
  if (snap.ok()) {
    index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
    return 1;
  }
  return snap.error() == ErrorCode::OBJECT_NOT_FOUND ? 0 : ToInt(snap.error());
}

Result<uint64_t> Client::GetSize(std::string_view key) {
  auto snap = Locate(key);
  if (!snap) return snap.error();
  index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());  // as the reference does
  return snap->value_size;
}

std::vector<int64_t> Client::GetRanges(std::string_view user_key, const std::vector<RangeCopy>& ranges) {
  std::vector<int64_t> out(ranges.size(), 0);
  std::string buf;
  std::string_view key;
  if (!ScopeKey(user_key, "get_into_ranges", &buf, &key)) {
    out.assign(ranges.size(), ToInt(ErrorCode::INVALID_PARAMS));
    return out;
  }
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = LocateStored(key);
    if (!snap) {
      if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
      out.assign(ranges.size(), ToInt(snap.error()));
      return out;
    }
    std::shared_lock<std::shared_mutex> lock(life_mu_);
    if (closed_) break;
    std::string disk_copy;  // a disk-resident value: read whole, then the ranges
    if (snap->state() == EntryState::kOnDisk) {
      disk_copy.resize(snap->value_size);
      MutSlice d{disk_copy.data(), disk_copy.size()};
      auto ok = CopyFromDisk(*snap, key, &d, 1);
      if (!ok) {
        out.assign(ranges.size(), ToInt(ok.error()));
        return out;
      }
      if (!*ok) continue;
    }
    const char* src = disk_copy.empty() ? index_->ValuePtr(*snap, key) : disk_copy.data();
    if (src == nullptr) continue;
    ObserveRange(src, snap->value_size);
    for (size_t i = 0; i < ranges.size(); ++i) {
      const RangeCopy& r = ranges[i];
      if (r.src_offset > snap->value_size || r.size > snap->value_size - r.src_offset) {
        out[i] = ToInt(ErrorCode::INVALID_PARAMS);
        continue;
      }
      memcpy(r.dst, src + r.src_offset, r.size);
      out[i] = int64_t(r.size);
    }
    if (pool_->failed()) break;  // see CopyValidated
    if (!disk_copy.empty() || index_->StillValid(*snap)) {  // a disk copy was validated by CopyFromDisk
      index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
      RecordRead(true);
      return out;
    }
  }
  out.assign(ranges.size(), ToInt(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS));
  return out;
}

}  // namespace mcxl
