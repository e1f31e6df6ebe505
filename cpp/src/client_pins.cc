// Zero-copy: pinned views into the pool (a record in this client's pin
// table that the master respects before freeing an extent) and the
// registered-buffer table that put_from/get_into check caller ranges against.
//
// Atomics: as stated at the top of client.cc.
#include "mooncake_cxl/client.h"

#include <immintrin.h>
#include <unistd.h>
#include <algorithm>
#include <cstring>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/log.h"
#include "mooncake_cxl/publish.h"
#include "mooncake_cxl/ring_server.h"
#include "client_internal.h"

namespace mcxl {

Result<PinnedView> Client::PinValue(std::string_view key) {
  for (int attempt = 0; attempt < kCopyRetries; ++attempt) {
    auto snap = Locate(key);
    if (snap.error() == ErrorCode::OBJECT_NOT_FOUND) RecordRead(false);
    if (!snap) return snap.error();
    std::shared_lock<std::shared_mutex> lock(life_mu_);
    if (closed_) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    const char* data = index_->ValuePtr(*snap, key);
    if (data == nullptr) continue;
    PinnedView v;
    {
      std::lock_guard<std::mutex> attach(attach_mu_);
      std::lock_guard<std::mutex> pins(pin_mu_);
      v.slot = slot_.load(std::memory_order_relaxed);
      v.slot_generation = slot_generation_.load(std::memory_order_relaxed);
      if (pin_slot_generation_ != v.slot_generation) {  // re-attached: a fresh table
        free_pins_.clear();
        pin_high_water_ = 0;
        pins_in_use_ = 0;
        pin_slot_generation_ = v.slot_generation;
      }
      uint32_t per = pool_->geometry().pins_per_client;
      if (free_pins_.empty() && pin_high_water_ >= per) {
        MCXL_LOG(kWarn, "client", "get_buffer of '%.*s': all %u pin records of this client are in use; "
                 "drop some BufferHandles", int(key.size()), key.data(), per);
        return ErrorCode::NO_AVAILABLE_HANDLE;
      }
      if (!free_pins_.empty()) {
        v.record = free_pins_.back();
        free_pins_.pop_back();
      } else {
        v.record = pin_high_water_++;
      }
      ClientSlot* cs = pool_->client_slot(v.slot);
      PinRecord& rec = pool_->pin_table(v.slot)[v.record];
      // Relaxed stores: the seq_cst fence below orders them before the
      // re-check, and the master reads them after its own seq_cst fence.
      cs->pins_in_use.store(++pins_in_use_, std::memory_order_relaxed);
      cs->pin_high_water.store(pin_high_water_, std::memory_order_relaxed);
      rec.generation.store(snap->generation(), std::memory_order_relaxed);
      rec.entry_plus1.store(snap->slot + 1, std::memory_order_relaxed);
      PublishRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
      PublishRange(&rec, sizeof(rec));
    }
    // seq_cst: pin stores before the version re-check (the Dekker pair with
    // the master's tombstone-then-scan; see Master::IsPinned).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (pool_->failed()) {
      lock.unlock();
      Unpin(v);
      return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
    }
    if (index_->StillValid(*snap)) {
      index_->ExtendLease(snap->slot, NowNs() + LeaseTtlNs());
      v.data = data;
      v.size = snap->value_size;
      RecordRead(true);
      return v;
    }
    lock.unlock();
    Unpin(v);
  }
  return ErrorCode::OBJECT_NOT_FOUND;
}

void Client::Unpin(const PinnedView& v) {
  std::shared_lock<std::shared_mutex> lock(life_mu_);
  if (closed_) return;  // the master cleared the table when we detached
  std::lock_guard<std::mutex> attach(attach_mu_);
  std::lock_guard<std::mutex> pins(pin_mu_);
  // A record of a previous slot is void: the master cleared that table.
  if (v.slot != slot_.load(std::memory_order_relaxed) || v.slot_generation != pin_slot_generation_) return;
  ClientSlot* cs = pool_->client_slot(v.slot);
  PinRecord& rec = pool_->pin_table(v.slot)[v.record];
  // Release: the caller's reads of the view happen before the extent can be
  // seen free.
  rec.entry_plus1.store(0, std::memory_order_release);
  cs->pins_in_use.store(--pins_in_use_, std::memory_order_relaxed);
  PublishRange(&rec, sizeof(rec));
  PublishRange(&cs->pins_in_use, sizeof(uint64_t));
  free_pins_.push_back(v.record);
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
  if (registered_.empty()) return ErrorCode::OK;
  // Registered buffers are disjoint: only the one starting at or before ptr
  // and the one after it can be crossed.
  auto next = registered_.upper_bound(ptr);
  if (next != registered_.end() && next->first < ptr + size) {
    MCXL_LOG(kWarn, "client", "%s: buffer [0x%lx, +%llu) straddles the start of the registered buffer "
             "[0x%lx, +%llu)", op, (unsigned long)ptr, (unsigned long long)size,
             (unsigned long)next->first, (unsigned long long)next->second);
    return ErrorCode::INVALID_PARAMS;
  }
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
  }
  return ErrorCode::OK;
}

}  // namespace mcxl
