// Zero-copy: pinned views into the pool (a record in this client's pin
// table that the master respects before freeing an extent, also after this
// client's close(), a reclaim of its live process, or a master restart:
// master_pins.cc) and the registered-buffer table that put_from/get_into
// check caller ranges against.
//
// Atomics: as stated at the top of client.cc.
#include "mooncake_cxl/client/client.h"

#include <unistd.h>
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
// Raises a word that only ever grows (pin_high_water): a stale writer of the
// same table can never lower it. Relaxed: ordered by PinValue's fence.
void RaiseTo(std::atomic<uint64_t>& w, uint64_t v) {
  uint64_t cur = w.load(std::memory_order_relaxed);
  while (cur < v && !w.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
constexpr int kReattachesPerPin = 3;
}  // namespace

Result<PinnedView> Client::PinValue(std::string_view user_key) {
  std::string buf;
  std::string_view key;
  if (!ScopeKey(user_key, "get_buffer", &buf, &key)) return ErrorCode::INVALID_PARAMS;
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  int reattaches = 0;
  PinnedView v;
  ReadTally tally;
  auto pinned = ReadLoop(key, KeyHash(key), nullptr, 0, &tally, [&](const EntrySnapshot& s) -> Result<bool> {
    if (s.state() == EntryState::kOnDisk) {
      // A view needs the bytes in the pool: have the master stage it.
      Status st = StageAndWait(s, key);
      if (!st.ok()) return st.error();
      return false;
    }
    // A view needs pool bytes a pin can hold; a segment's are not.
    if (s.state() == EntryState::kInSegment) return ErrorCode::NOT_SUPPORTED;
    const char* data = index_->ValuePtr(s, key);
    if (data == nullptr) return false;
    bool slot_lost = false;
    Status claimed = ClaimPin(s, key, &v, &slot_lost);
    if (!claimed.ok()) return claimed.error();
    if (!slot_lost) {
      // seq_cst: the claim before the re-checks (the Dekker pairs with the
      // master's tombstone-then-scan, Master::IsPinned, and with its
      // generation-store-then-scan when it reclaims the slot, RetireOrClearPins).
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (pool_->failed()) {
        Unpin(v);
        return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
      }
      // Acquire: as in ClaimPin.
      const ClientSlot* cs = pool_->client_slot(v.slot);
      ObserveRange(&cs->generation, sizeof(uint64_t));
      slot_lost = cs->generation.load(std::memory_order_acquire) != v.slot_generation;
      // The view's bytes are read later, straight from the pool: on a
      // non-coherent pool this host's stale lines of them go now, before
      // the closing check (they are fixed while the pin holds).
      ObserveRange(data, s.value_size);
      if (!slot_lost && index_->StillValid(s)) {
        v.data = data;
        v.size = s.value_size;
        return true;
      }
      Unpin(v);
    }
    if (slot_lost) {
      // Reclaimed (stopped past --client_ttl), retired, or a restarted
      // master: re-attach (taking back a retired slot with its pins), then
      // pin in the table we hold.
      if (++reattaches > kReattachesPerPin) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
      Status a = Attach(false);
      if (!a.ok()) return a.error();
    }
    return false;
  });
  RecordReads(tally.hits, tally.misses);
  if (!pinned) return pinned.error();
  return v;
}

Status Client::ClaimPin(const EntrySnapshot& snap, std::string_view key, PinnedView* v, bool* slot_lost) {
  v->object_offset = snap.object_offset;
  v->generation = snap.generation();
  std::lock_guard<std::mutex> attach(attach_mu_);
  std::lock_guard<std::mutex> pins(pin_mu_);
  v->slot = slot_.load(std::memory_order_relaxed);
  v->slot_generation = slot_generation_.load(std::memory_order_relaxed);
  ClientSlot* cs = pool_->client_slot(v->slot);
  // Acquire: pairs with the master's release store when it assigns,
  // reclaims or retires the slot. A table that is no longer ours is not
  // written (it may be another client's by now).
  ObserveRange(&cs->generation, sizeof(uint64_t));
  *slot_lost = cs->generation.load(std::memory_order_acquire) != v->slot_generation;
  if (*slot_lost) return ErrorCode::OK;
  if (pin_slot_ != v->slot) {  // a different slot: its table starts empty for us
    free_pins_.clear();
    pin_high_water_ = 0;
    pin_slot_ = v->slot;
  }
  uint32_t per = pool_->geometry().pins_per_client;
  PinRecord* table = pool_->pin_table(v->slot);
  for (;;) {
    if (free_pins_.empty() && pin_high_water_ >= per) {
      MCXL_LOG(kWarn, "client", "get_buffer of '%.*s': all %u pin records of this client are in use; "
               "drop some BufferHandles", int(key.size()), key.data(), per);
      return ErrorCode::NO_AVAILABLE_HANDLE;
    }
    uint32_t r = pin_high_water_;
    if (free_pins_.empty()) {
      ++pin_high_water_;
    } else {
      r = free_pins_.back();
      free_pins_.pop_back();
    }
    RaiseTo(cs->pin_high_water, pin_high_water_);  // the master scans [0, high water)
    // Relaxed claim and stores: the seq_cst fence in PinValue orders them
    // before the re-checks, and the master reads them after its own seq_cst
    // fence. A CAS, so that a stale writer of this table (one stopped across
    // its reclaim) and we never share a record.
    uint64_t expected = 0;
    if (table[r].object_offset.compare_exchange_strong(expected, v->object_offset, std::memory_order_relaxed)) {
      table[r].generation.store(v->generation, std::memory_order_relaxed);
      v->record = r;
      break;
    }
    // Held by such a stale writer: skip the record.
  }
  cs->pins_in_use.fetch_add(1, std::memory_order_relaxed);
  PublishRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
  PublishRange(&table[v->record], sizeof(PinRecord));
  return ErrorCode::OK;
}

void Client::Unpin(const PinnedView& v) {
  // No life_mu_ and no closed_ check: a closed client's views keep their
  // pins (the master retires its table) until they are dropped, and the
  // pool stays mapped while this Client lives.
  std::lock_guard<std::mutex> pins(pin_mu_);
  // A record of a table we no longer hold is void: the master released it.
  if (v.slot != pin_slot_) return;
  ClientSlot* cs = pool_->client_slot(v.slot);
  PinRecord& rec = pool_->pin_table(v.slot)[v.record];
  uint64_t expected = v.object_offset;
  // Release: the caller's reads of the view happen before the extent can be
  // seen free. Fails only when the master dropped the record (PinHeld).
  if (!rec.object_offset.compare_exchange_strong(expected, 0, std::memory_order_release,
                                                 std::memory_order_relaxed))
    return;
  cs->pins_in_use.fetch_sub(1, std::memory_order_relaxed);
  PublishRange(&rec, sizeof(rec));
  PublishRange(&cs->pins_in_use, sizeof(uint64_t));
  free_pins_.push_back(v.record);
}

bool Client::PinHeld(const PinnedView& v) const {
  const PinRecord& rec = pool_->pin_table(v.slot)[v.record];
  ObserveRange(&rec, sizeof(rec));
  // Relaxed: only the master's clear is of interest; nothing is read
  // through the record.
  return rec.object_offset.load(std::memory_order_relaxed) == v.object_offset &&
         rec.generation.load(std::memory_order_relaxed) == v.generation;
}

Status Client::RegisterBuffer(uintptr_t ptr, uint64_t size) {
  if (ptr == 0 || size == 0 || ptr + size < ptr) {
    MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): %s", (unsigned long)ptr,
             (unsigned long long)size, ptr == 0 ? "null pointer" : size == 0 ? "size is 0" : "range wraps");
    return ErrorCode::INVALID_PARAMS;
  }
  std::unique_lock<std::shared_mutex> lock(registry_mu_);
  auto next = registered_.lower_bound(ptr);
  if (next != registered_.end() && next->first < ptr + size) {
    MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): overlaps the registered buffer [0x%lx, +%llu)",
             (unsigned long)ptr, (unsigned long long)size, (unsigned long)next->first,
             (unsigned long long)next->second);
    return ErrorCode::INVALID_PARAMS;
  }
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > ptr) {
      MCXL_LOG(kWarn, "client", "register_buffer(0x%lx, %llu): overlaps the registered buffer [0x%lx, +%llu)",
               (unsigned long)ptr, (unsigned long long)size, (unsigned long)prev->first,
               (unsigned long long)prev->second);
      return ErrorCode::INVALID_PARAMS;
    }
  }
  registered_[ptr] = size;
  lock.unlock();
  PrefaultForWrite(reinterpret_cast<void*>(ptr), size);
  return ErrorCode::OK;
}

Status Client::UnregisterBuffer(uintptr_t ptr) {
  std::unique_lock<std::shared_mutex> lock(registry_mu_);
  auto it = registered_.find(ptr);
  if (it == registered_.end()) {
    MCXL_LOG(kWarn, "client", "unregister_buffer(0x%lx): no registered buffer starts there (%zu registered)",
             (unsigned long)ptr, registered_.size());
    return ErrorCode::INVALID_PARAMS;
  }
  registered_.erase(it);
  return ErrorCode::OK;
}

Status Client::CheckRange(uintptr_t ptr, uint64_t size, const char* op) const {
  if (ptr == 0 || ptr + size < ptr) {
    MCXL_LOG(kWarn, "client", "%s: buffer 0x%lx of %llu bytes is %s", op, (unsigned long)ptr,
             (unsigned long long)size, ptr == 0 ? "a null pointer" : "a range that wraps");
    return ErrorCode::INVALID_PARAMS;
  }
  std::shared_lock<std::shared_mutex> lock(registry_mu_);
  if (registered_.empty() && !options_.strict_buffers) return ErrorCode::OK;
  // Registered buffers are disjoint: only the one starting at or before ptr
  // and the one after it can be crossed.
  auto next = registered_.upper_bound(ptr);
  if (next != registered_.end() && next->first < ptr + size) {
    MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) straddles the start of the registered buffer "
             "[0x%lx, +%llu)", op, (unsigned long)ptr, (unsigned long long)size,
             (unsigned long)next->first, (unsigned long long)next->second);
    return ErrorCode::INVALID_PARAMS;
  }
  bool inside = false;
  if (next != registered_.begin()) {
    auto prev = std::prev(next);
    uint64_t end = prev->first + prev->second;
    if (ptr < end && ptr + size > end) {
      MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) runs %llu bytes past the end of the registered "
               "buffer [0x%lx, +%llu)", op, (unsigned long)ptr, (unsigned long long)size,
               (unsigned long long)(ptr + size - end), (unsigned long)prev->first,
               (unsigned long long)prev->second);
      return ErrorCode::INVALID_PARAMS;
    }
    inside = ptr < end;
  }
  if (options_.strict_buffers && !inside) {
    MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) lies in no registered buffer (strict buffers: "
             "MC_CXL_STRICT_BUFFERS / setup(strict_buffers=True))", op, (unsigned long)ptr,
             (unsigned long long)size);
    return ErrorCode::INVALID_PARAMS;
  }
  return ErrorCode::OK;
}

Status Client::CheckRangeFrom(uintptr_t base, uint64_t offset, uint64_t size, const char* op) const {
  if (base + offset < base) {
    MCXL_LOG(kWarn, "client", "%s: offset %llu from buffer 0x%lx wraps", op, (unsigned long long)offset,
             (unsigned long)base);
    return ErrorCode::INVALID_PARAMS;
  }
  {
    std::shared_lock<std::shared_mutex> lock(registry_mu_);
    auto next = registered_.upper_bound(base);
    if (next != registered_.begin()) {
      auto holder = std::prev(next);
      uint64_t end = holder->first + holder->second;
      // base lies in this buffer: the range must too (offset and size
      // compared against what is left, so nothing overflows).
      if (base < end && (offset > end - base || size > end - base - offset)) {
        MCXL_LOG(kWarn, "client", "%s: range [+%llu, +%llu) of buffer 0x%lx runs past the end of its registered "
                 "buffer [0x%lx, +%llu)", op, (unsigned long long)offset, (unsigned long long)size,
                 (unsigned long)base, (unsigned long)holder->first, (unsigned long long)holder->second);
        return ErrorCode::INVALID_PARAMS;
      }
    }
  }
  return CheckRange(base + offset, size, op);
}

}  // namespace mcxl
