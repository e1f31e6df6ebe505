// Pin tables that outlive their attachment. Contract: while a BufferHandle
// lives, its bytes never change. A handle's pin is a record in its client's
// pin table (layout.h, PinRecord); the master honours every record of an
// attached slot and of a *retired* one: a slot whose attachment ended
// (heartbeat expired, e.g. a SIGSTOPped process; detached by close(); or a
// master restart) while its process may still be alive and hold views.
//
//   * Reclaim / restart: a slot whose table holds records and whose process
//     is not known dead is retired (ClientSlot::generation = ended generation
//     | kSlotRetired) instead of cleared; it is not handed to another client.
//   * A re-attach naming the ended (slot, generation) takes the slot back
//     with its table (master_clients.cc, HandleAttach), so a resumed or
//     reconnected client's handles keep their pins.
//   * A retired table is released when it holds no record (the last view was
//     dropped), when its process is known dead (same machine: pid check), or,
//     for another host's client whose liveness cannot be checked, after
//     --put_start_release_timeout_sec (logged: the one residual, its views
//     may then change).
//   * Recovery keeps retired tables and reserves the extents of objects that
//     were unlinked while viewed (the record names the object's offset and
//     generation), so a restart frees nothing a live view shows.
//
// Atomics follow the three rules stated in master_impl.h; the records are client
// lines (relaxed, after ObserveRange). The clears below race only with a
// stale client's claim, which its own generation re-check undoes (see
// Client::PinValue).
#include <algorithm>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/common/log.h"
#include "master_impl.h"
#include "mooncake_cxl/pool/object_header.h"
#include "mooncake_cxl/pool/publish.h"
#include "mooncake_cxl/control/shm_ring.h"

namespace mcxl {

bool MasterImpl::TableHasPins(uint32_t slot) const {
  uint32_t per = pool_->geometry().pins_per_client;
  ClientSlot* cs = pool_->client_slot(slot);
  ObserveRange(&cs->pins_in_use, 2 * sizeof(uint64_t));
  uint64_t hwm = std::min<uint64_t>(cs->pin_high_water.load(std::memory_order_relaxed), per);
  const PinRecord* t = pool_->pin_table(slot);
  ObserveRange(t, hwm * sizeof(PinRecord));
  for (uint64_t i = 0; i < hwm; ++i)
    if (t[i].object_offset.load(std::memory_order_relaxed) != 0) return true;
  return false;
}

void MasterImpl::ClearPinTable(uint32_t slot, bool owner_may_live) {
  uint32_t per = pool_->geometry().pins_per_client;
  PinRecord* t = pool_->pin_table(slot);
  // The owner's lines: observed first, so the clear is based on its last
  // write-back (a non-coherent pool; the owner no longer writes them).
  ObserveRange(t, per * sizeof(PinRecord));
  ObserveRange(&pool_->client_slot(slot)->heartbeat_ns, kCacheLine);
  for (uint32_t i = 0; i < per; ++i) t[i].object_offset.store(0, std::memory_order_relaxed);
  PublishRange(t, per * sizeof(PinRecord));
  if (owner_may_live) return;  // its counters may be mid-update: too high is harmless, too low is not
  ClientSlot* cs = pool_->client_slot(slot);
  cs->pins_in_use.store(0, std::memory_order_relaxed);
  cs->pin_high_water.store(0, std::memory_order_relaxed);
  PublishRange(&cs->heartbeat_ns, kCacheLine);
}

bool MasterImpl::RingCallerHolds(uint32_t slot, uint64_t generation) {
  return ShmRing::CallerOf(pool_->ring(slot, 0)) == generation;
}

void MasterImpl::RetireOrClearPins(uint32_t slot, const ClientInfo& was, bool owner_dead, bool in_ring_call) {
  // seq_cst fence: the caller's generation store before it and the record
  // loads after it form a Dekker pair with the client's claim, fence,
  // generation re-check: either we see its record or it sees its slot gone.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool pins = !owner_dead && TableHasPins(slot);
  if (owner_dead || (!pins && !in_ring_call)) {
    ClearPinTable(slot, !owner_dead);
    return;
  }
  retired_[slot] = RetiredPins{true, was.generation, was.pid, was.local, MonoNs()};
  MarkPinTable(slot);
  ClientSlot* cs = pool_->client_slot(slot);
  // Release: publishes the marker a recovering master reads (and the client
  // compares with its own generation).
  cs->generation.store(was.generation | kSlotRetired, std::memory_order_release);
  PublishRange(cs, kCacheLine);
  MCXL_LOG(kInfo, "master", "client slot %u (pid %llu) retired %s: kept from other clients until it "
           "re-attaches, %s or exits", slot, (unsigned long long)was.pid,
           pins ? "with live views" : "inside a ring call", pins ? "drops them" : "leaves its call");
}

void MasterImpl::CheckRetiredPins() {
  uint64_t now = MonoNs();
  uint64_t expiry = config_.put_start_release_timeout_sec * kNsPerSec;
  for (uint32_t i = 0; i < retired_.size(); ++i) {
    RetiredPins& r = retired_[i];
    if (!r.active) continue;
    bool dead = r.local && LocalPidDead(r.pid);
    bool expired = !r.local && now - r.since_mono_ns > expiry;
    bool empty = !TableHasPins(i) && !RingCallerHolds(i, r.generation);
    if (!dead && !expired && !empty) continue;
    if (expired && !empty)
      MCXL_LOG(kWarn, "master", "retired client slot %u of another host (pid %llu) still holds views after "
               "%llu s; its pins are dropped and those views may change", i, (unsigned long long)r.pid,
               (unsigned long long)config_.put_start_release_timeout_sec);
    r.active = false;
    ClientSlot* cs = pool_->client_slot(i);
    cs->generation.store(0, std::memory_order_release);
    PublishRange(cs, kCacheLine);
    ClearPinTable(i, !dead);
    MCXL_LOG(kInfo, "master", "retired client slot %u released: %s", i,
             dead ? "its process exited" : empty ? "its views and rings were dropped" : "expired");
  }
}

void MasterImpl::RecoverPinTable(uint32_t slot) {
  ClientSlot* cs = pool_->client_slot(slot);
  uint64_t g = cs->generation.load(std::memory_order_relaxed);
  uint64_t pid = cs->pid.load(std::memory_order_relaxed);
  bool local = cs->machine_hash.load(std::memory_order_relaxed) == KeyHash(machine_);
  bool dead = g == 0 || (local && LocalPidDead(pid));
  if (!dead && (TableHasPins(slot) || RingCallerHolds(slot, g & ~kSlotRetired))) {
    uint64_t ended = g & ~kSlotRetired;
    retired_[slot] = RetiredPins{true, ended, pid, local, MonoNs()};
    MarkPinTable(slot);
    cs->generation.store(ended | kSlotRetired, std::memory_order_relaxed);
    MCXL_LOG(kInfo, "master", "recovery: client slot %u (pid %llu) holds views or its rings: retired",
             slot, (unsigned long long)pid);
  } else {
    cs->generation.store(0, std::memory_order_relaxed);  // the client re-attaches
    ClearPinTable(slot, !dead);
  }
}

void MasterImpl::ReservePinnedExtents() {
  uint32_t per = pool_->geometry().pins_per_client;
  for (uint32_t c = 0; c < retired_.size(); ++c) {
    if (!retired_[c].active) continue;
    ClientSlot* cs = pool_->client_slot(c);
    uint64_t hwm = std::min<uint64_t>(cs->pin_high_water.load(std::memory_order_relaxed), per);
    const PinRecord* t = pool_->pin_table(c);
    for (uint64_t i = 0; i < hwm; ++i) {
      uint64_t off = t[i].object_offset.load(std::memory_order_relaxed);
      uint64_t gen = t[i].generation.load(std::memory_order_relaxed);
      if (off == 0) continue;
      // Bounds-checked copy: the record is client-written pool memory.
      ObjectHeader h;
      if (!CheckedObjectHeader(*pool_, off, &h) || h.generation != gen) continue;  // stale or bogus
      next_generation_ = std::max(next_generation_, gen + 1);
      // A live object's extent is reserved already (Reserve fails, IsPinned
      // protects it); an unlinked one's is kept until the view goes.
      auto ext = alloc_->Reserve(off, h.extent_size);
      if (!ext) continue;
      pinned_.push_back({ext->handle, gen});
      MCXL_LOG(kInfo, "master", "recovery: kept the extent of a removed object still viewed by client slot %u",
               c);
    }
  }
}

}  // namespace mcxl
