// SSD tier writer: Append (one record, or many packed into one write per
// 4 MiB), Remove (tombstones, likewise packed), and the index queries and
// statistics. Where records go: disk_tier_space.cc; their bytes:
// disk_tier_record.cc; the rebuild at Open: disk_tier_open.cc. Format and
// policy: disk_tier.h.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "disk_tier_internal.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl::tier {
namespace {

// The index side of a written tombstone of `bytes` at (seg, off): the key's
// live record turns dead (under mu).
void CommitTombstone(DiskTier::Impl& t, KeyState& st, uint32_t seg, uint64_t off, uint64_t bytes,
                     uint64_t generation) {
  if (st.live.segment_id != 0) {
    t.AddLive(st.live.segment_id, -int64_t(RecordBytes(st.live.key_len, st.live.value_len)));
    st.live = RecordLocation{};
    st.dead_values++;
    t.objects--;
  }
  if (st.tomb_seg != 0 && st.tomb_live) t.AddLive(st.tomb_seg, -int64_t(bytes));
  st.tomb_seg = seg;
  st.tomb_off = off;
  st.tomb_live = st.dead_values > 0;
  if (st.tomb_live) t.AddLive(seg, int64_t(bytes));
  st.tombs++;
  st.tomb_gen = std::max(st.tomb_gen, generation);
  t.max_gen = std::max(t.max_gen, generation);
}

// The index side of a written value record (under mu).
void CommitValue(DiskTier::Impl& t, std::string_view key, const RecordLocation& loc, uint64_t seq) {
  KeyState& st = t.keys[std::string(key)];
  if (st.live.segment_id != 0) {
    t.AddLive(st.live.segment_id, -int64_t(RecordBytes(st.live.key_len, st.live.value_len)));
    st.dead_values++;
  } else {
    t.objects++;
  }
  st.live = loc;
  st.live_seq = seq;
  t.AddLive(loc.segment_id, int64_t(RecordBytes(loc.key_len, loc.value_len)));
  t.Reaccount(st, key.size());
  t.max_gen = std::max(t.max_gen, loc.generation);
  t.appends++;
}

// Append's checks on one item (under wmu).
ErrorCode CheckAppend(const DiskTier::Impl& t, const DiskTier::BatchItem& it) {
  if (it.key.empty() || it.key.size() > kMaxTierKeyLength || it.len > kMaxTierValueLength ||
      (it.value == nullptr && it.len > 0)) {
    MCXL_LOG(kWarn, "disk_tier", "append: bad key length %zu or value length %llu", it.key.size(),
             (unsigned long long)it.len);
    return ErrorCode::INVALID_PARAMS;
  }
  auto k = t.keys.find(std::string(it.key));
  if (k != t.keys.end()) {
    const KeyState& st = k->second;
    if ((st.live.segment_id != 0 && it.generation < st.live.generation) ||
        (st.tombs > 0 && it.generation <= st.tomb_gen)) {
      MCXL_LOG(kWarn, "disk_tier", "append: generation %llu is stale for its key",
               (unsigned long long)it.generation);
      return ErrorCode::INVALID_VERSION;
    }
  }
  return ErrorCode::OK;
}
constexpr uint64_t kBatchItemMax = 1ull << 20;  // larger records: one write each anyway

// The state of `key` when it has a live record that a tombstone of
// `generation` hides, else null (the tombstone is not written). Under wmu.
KeyState* KeyToHide(DiskTier::Impl& t, std::string_view key, uint64_t generation) {
  auto it = t.keys.find(std::string(key));
  if (it == t.keys.end() || it->second.live.segment_id == 0 || it->second.live.generation > generation)
    return nullptr;
  return &it->second;
}

}  // namespace

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

Result<RecordLocation> DiskTier::Append(std::string_view key, const void* value, uint64_t len,
                                        uint64_t generation) {
  Impl& t = *impl_;
  std::lock_guard<std::mutex> wlock(t.wmu);
  ErrorCode c = CheckAppend(t, BatchItem{key, value, len, generation});
  if (c != ErrorCode::OK) return c;
  const uint64_t bytes = RecordBytes(key.size(), len);
  uint32_t seg = 0;
  uint64_t off = 0;
  Status s = t.Reserve(bytes, false, &seg, &off);
  if (!s.ok()) return s.error();

  RecordHeader h = NewRecordHeader(kKindValue, key, seg, off, len, generation, t.next_seq++);
  uint8_t* stage = ThreadBuffer(1, kChunkBytes);
  uint8_t* blk0 = ThreadBuffer(2, kBlockSize);
  if (stage == nullptr || blk0 == nullptr) {
    t.Unreserve(seg, off, bytes);
    return ErrorCode::INTERNAL_ERROR;
  }
  int e = WriteImage(t.active_fd, stage, blk0, t.opt.sync_each_append, &h, key, static_cast<const uint8_t*>(value));
  if (e != 0) {
    t.Unreserve(seg, off, bytes);
    t.WriteFailed(e, "append", seg, off);
    return WriteErrorCode(e);
  }
  RecordLocation loc{seg, 0, off, len, h.value_crc, uint32_t(key.size()), generation};
  std::lock_guard<std::mutex> lock(t.mu);
  CommitValue(t, key, loc, h.seq);
  return loc;
}

std::vector<Result<RecordLocation>> DiskTier::AppendBatch(const std::vector<BatchItem>& items) {
  Impl& t = *impl_;
  std::vector<Result<RecordLocation>> out(items.size(), Result<RecordLocation>(ErrorCode::INTERNAL_ERROR));
  std::vector<size_t> single;  // indexes written one by one (after the batches)
  {
    std::lock_guard<std::mutex> wlock(t.wmu);
    uint8_t* buf = ThreadBuffer(1, kChunkBytes);
    std::unordered_set<std::string_view> seen;
    std::vector<size_t> group;
    uint64_t group_bytes = 0;
    bool group_new_seg = false;  // the group starts a new segment (Reserve rolls)
    // Would Reserve(group_bytes + extra) not roll (Reserve's rule), the group
    // starting where it will start?
    auto fits = [&](uint64_t extra) {
      uint64_t end = 0;
      if (group_new_seg) end = kBlockSize;
      else if (t.active_id != 0 && t.active_fd >= 0) end = t.segs[t.active_id].end;
      else return false;
      return end + group_bytes + extra <= t.opt.segment_bytes || end + group_bytes <= kBlockSize;
    };
    // Writes `group` as one pwrite at a freshly reserved offset.
    auto flush = [&]() {
      if (group.empty()) return;
      uint32_t seg = 0;
      uint64_t off = 0;
      Status s = buf == nullptr ? Status(ErrorCode::INTERNAL_ERROR) : t.Reserve(group_bytes, false, &seg, &off);
      if (!s.ok()) {  // e.g. the capacity holds some but not all: one by one decides
        single.insert(single.end(), group.begin(), group.end());
        group.clear();
        group_bytes = 0;
        group_new_seg = false;
        return;
      }
      std::vector<std::pair<RecordLocation, uint64_t>> locs;  // (location, seq)
      uint64_t rel = 0;
      for (size_t i : group) {
        const BatchItem& it = items[i];
        RecordHeader h = PackRecord(buf + rel, kKindValue, it.key, static_cast<const uint8_t*>(it.value), it.len,
                                    seg, off + rel, it.generation, t.next_seq++);
        locs.push_back({RecordLocation{seg, 0, off + rel, it.len, h.value_crc, uint32_t(it.key.size()), it.generation},
                        h.seq});
        rel += RecordBytes(it.key.size(), it.len);
      }
      int e = PwriteFull(t.active_fd, buf, group_bytes, off);
      if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
      if (e != 0) {
        t.Unreserve(seg, off, group_bytes);
        t.WriteFailed(e, "batch of records", seg, off);
        for (size_t i : group) out[i] = WriteErrorCode(e);
      } else {
        std::lock_guard<std::mutex> lock(t.mu);
        for (size_t j = 0; j < group.size(); ++j) {
          CommitValue(t, items[group[j]].key, locs[j].first, locs[j].second);
          out[group[j]] = locs[j].first;
        }
      }
      group.clear();
      group_bytes = 0;
      group_new_seg = false;
    };
    for (size_t i = 0; i < items.size(); ++i) {
      const BatchItem& it = items[i];
      ErrorCode c = CheckAppend(t, it);
      if (c != ErrorCode::OK) {
        out[i] = c;
        continue;
      }
      const uint64_t rb = RecordBytes(it.key.size(), it.len);
      if (it.len > kBatchItemMax || !seen.insert(it.key).second) {
        single.push_back(i);  // a repeated key is checked against the first one's result
        continue;
      }
      if (!group.empty() && (group_bytes + rb > kChunkBytes || !fits(rb))) flush();
      if (group.empty()) group_new_seg = !fits(rb);  // Reserve will roll for this group
      group.push_back(i);
      group_bytes += rb;
    }
    flush();
  }
  std::sort(single.begin(), single.end());
  for (size_t i : single) out[i] = Append(items[i].key, items[i].value, items[i].len, items[i].generation);
  return out;
}

Status DiskTier::Remove(std::string_view key, uint64_t generation) {
  Impl& t = *impl_;
  if (key.empty() || key.size() > kMaxTierKeyLength) return ErrorCode::INVALID_PARAMS;
  std::lock_guard<std::mutex> wlock(t.wmu);
  KeyState* st = KeyToHide(t, key, generation);
  if (st == nullptr) return ErrorCode::OK;  // nothing live that this tombstone would hide
  const uint64_t bytes = RecordBytes(key.size(), 0);
  uint32_t seg = 0;
  uint64_t off = 0;
  // A full filesystem: the reserve file gives way once so removes still work.
  for (int attempt = 0;; attempt++) {
    auto retry = [&](ErrorCode code) {
      return code == ErrorCode::NO_AVAILABLE_HANDLE && attempt == 0 && t.ReleaseReserve();
    };
    // A tombstone frees space (its record turns dead): it may use the capacity headroom.
    Status s = t.Reserve(bytes, true, &seg, &off);
    if (!s.ok() && retry(s.error())) continue;
    if (!s.ok()) return s;
    RecordHeader h = NewRecordHeader(kKindTombstone, key, seg, off, 0, generation, t.next_seq++);
    uint8_t* stage = ThreadBuffer(1, kChunkBytes);
    uint8_t* blk0 = ThreadBuffer(2, kBlockSize);
    if (stage == nullptr || blk0 == nullptr) {  // as in Append
      t.Unreserve(seg, off, bytes);
      return ErrorCode::INTERNAL_ERROR;
    }
    int e = WriteImage(t.active_fd, stage, blk0, t.opt.sync_each_append, &h, key, nullptr);
    if (e != 0) {
      t.Unreserve(seg, off, bytes);
      t.WriteFailed(e, "tombstone", seg, off);
      if (retry(WriteErrorCode(e))) continue;
      return WriteErrorCode(e);
    }
    break;
  }
  std::lock_guard<std::mutex> lock(t.mu);
  CommitTombstone(t, *st, seg, off, bytes, generation);
  return ErrorCode::OK;
}

std::vector<Status> DiskTier::RemoveBatch(const std::vector<std::pair<std::string_view, uint64_t>>& items) {
  Impl& t = *impl_;
  std::vector<Status> out(items.size(), Status(ErrorCode::OK));
  std::vector<size_t> single;  // written one by one (Remove) after the packed writes
  {
    std::lock_guard<std::mutex> wlock(t.wmu);
    uint8_t* buf = ThreadBuffer(1, kChunkBytes);
    std::unordered_set<std::string_view> seen;
    std::vector<size_t> group;
    uint64_t group_bytes = 0;
    // One pwrite for the group at a fresh place (tombstones may use the
    // capacity headroom, as in Remove); any failure: Remove one by one decides.
    auto flush = [&]() {
      if (group.empty()) return;
      uint32_t seg = 0;
      uint64_t off = 0;
      Status s = buf == nullptr ? Status(ErrorCode::INTERNAL_ERROR) : t.Reserve(group_bytes, true, &seg, &off);
      int e = 0;
      if (s.ok()) {
        uint64_t rel = 0;
        for (size_t i : group) {
          std::string_view key = items[i].first;
          PackRecord(buf + rel, kKindTombstone, key, nullptr, 0, seg, off + rel, items[i].second, t.next_seq++);
          rel += RecordBytes(key.size(), 0);
        }
        e = PwriteFull(t.active_fd, buf, group_bytes, off);
        if (e == 0 && t.opt.sync_each_append && fdatasync(t.active_fd) != 0) e = errno;
        if (e != 0) {
          t.Unreserve(seg, off, group_bytes);
          t.WriteFailed(e, "batch of tombstones", seg, off);
        }
      }
      if (!s.ok() || e != 0) {
        single.insert(single.end(), group.begin(), group.end());
      } else {
        std::lock_guard<std::mutex> lock(t.mu);
        uint64_t rel = 0;
        for (size_t i : group) {
          const uint64_t rb = RecordBytes(items[i].first.size(), 0);
          auto it = t.keys.find(std::string(items[i].first));
          if (it != t.keys.end()) CommitTombstone(t, it->second, seg, off + rel, rb, items[i].second);
          rel += rb;
        }
      }
      group.clear();
      group_bytes = 0;
    };
    for (size_t i = 0; i < items.size(); ++i) {
      std::string_view key = items[i].first;
      if (key.empty() || key.size() > kMaxTierKeyLength) {
        out[i] = ErrorCode::INVALID_PARAMS;
        continue;
      }
      if (!seen.insert(key).second) {  // a repeated key: after the first one's write
        single.push_back(i);
        continue;
      }
      if (KeyToHide(t, key, items[i].second) == nullptr) continue;  // no write (as Remove)
      const uint64_t rb = RecordBytes(key.size(), 0);
      if (!group.empty() && group_bytes + rb > kChunkBytes) flush();
      group.push_back(i);
      group_bytes += rb;
    }
    flush();
  }
  std::sort(single.begin(), single.end());
  for (size_t i : single) out[i] = Remove(items[i].first, items[i].second);
  return out;
}

void DiskTier::ForEachLive(
    const std::function<void(std::string_view key, const RecordLocation&)>& fn) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (const auto& [key, st] : impl_->keys)
    if (st.live.segment_id != 0) fn(key, st.live);
}

Result<RecordLocation> DiskTier::Lookup(std::string_view key) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->keys.find(std::string(key));
  if (it == impl_->keys.end() || it->second.live.segment_id == 0) return ErrorCode::OBJECT_NOT_FOUND;
  return it->second.live;
}

uint64_t DiskTier::MaxGeneration() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->max_gen;
}

void DiskTier::SetRelocationCallback(RelocationCallback cb) {
  std::lock_guard<std::mutex> lock(impl_->cmu);
  impl_->reloc_cb = std::move(cb);
}

void DiskTier::SetTestHook(std::function<void(const char* point)> hook) {
  std::lock_guard<std::mutex> c(impl_->cmu);
  std::lock_guard<std::mutex> w(impl_->wmu);
  impl_->hook = std::move(hook);
}

const std::string& DiskTier::root_dir() const { return impl_->opt.root_dir; }

Stats DiskTier::stats() const {
  const Impl& t = *impl_;
  Stats s;
  ReaderCounters rc = GetReaderCounters();
  std::lock_guard<std::mutex> lock(t.mu);
  s.capacity = t.opt.capacity_bytes;
  s.used_bytes = t.used;
  for (const auto& [id, seg] : t.segs) s.live_bytes += seg.live;
  s.objects = t.objects;
  s.segments = t.segs.size();
  s.appends = t.appends;
  s.reads = rc.reads;
  s.checksum_failures = rc.checksum_failures;
  s.compactions = t.compactions;
  s.relocations = t.relocations;
  s.direct_io = t.active_id != 0 ? t.active_direct : false;
  s.capacity_effective = t.cap_eff;
  s.fs_free_bytes = t.fs_avail;
  s.fs_full = t.fs_full;
  s.enospc = t.enospc;
  s.damage_dropped = t.damage_dropped;
  s.write_errors = t.write_errors;
  return s;
}

void DiskTier::RefreshSpace() {
  std::lock_guard<std::mutex> wlock(impl_->wmu);
  impl_->RefreshSpace();
}

}  // namespace mcxl::tier
