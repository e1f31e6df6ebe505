// ExtentAllocator: variable-size extents of the pool's data region.
//
// Contract: Allocate returns a 64-byte-aligned extent of at least the
// requested size (rounded up to 64 bytes) or NO_AVAILABLE_HANDLE. Free
// returns an extent to the free space and coalesces it with free neighbours,
// so space freed by objects of one size is reusable by objects of any other.
// Both are O(1): a two-level segregated fit (TLSF) over power-of-two classes
// with 16 linear subdivisions each, "good fit" search (the first non-empty
// class whose smallest block fits), boundary links between neighbours.
// All bookkeeping lives in arrays reserved at construction for `max_blocks`
// blocks (used + free), so no call allocates heap memory; their pages are
// touched only as blocks come into use.
//
// The allocator lives in the master's memory only; after a restart the master
// rebuilds it with Reserve() from the index (the index is the truth).
//
// Thread safety: none; the master's single thread owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "mooncake_cxl/common/error_code.h"

namespace mcxl {

struct Extent {
  uint64_t offset = 0;  // from the start of the pool
  uint64_t size = 0;    // bytes actually reserved (>= requested)
  uint64_t handle = 0;  // pass to Free: block index + the block's generation
};

class ExtentAllocator {
 public:
  // Manages [base, base + size). `max_blocks` bounds used + free extents.
  ExtentAllocator(uint64_t base, uint64_t size, uint64_t max_blocks);

  Result<Extent> Allocate(uint64_t size);
  // REQUIRES: `handle` came from Allocate or Reserve and was not freed since
  // (checked: a stale or unknown handle is INVALID_PARAMS, nothing changes).
  Status Free(uint64_t handle);
  // Keeps the first `size` bytes (rounded up to 64) of the extent and frees
  // the rest (coalesced with a free neighbour); the handle stays valid. The
  // SSD tier turns a demoted object's extent into its small stub this way.
  Status Shrink(uint64_t handle, uint64_t size);
  // Marks [offset, offset + size) used, for restart recovery. Fails when any
  // part of it is not free (overlap with a reserved extent) or out of range.
  Result<Extent> Reserve(uint64_t offset, uint64_t size);
  // The extent `handle` names, when it is allocated (not freed since): the
  // master's own record of where an object lies, independent of the pool.
  bool Lookup(uint64_t handle, Extent* out) const;
  // A hint: brings the record Lookup and Free of `handle` read into cache.
  void Prefetch(uint64_t handle) const {
    if (uint32_t(handle) < blocks_.size()) __builtin_prefetch(&blocks_[uint32_t(handle)]);
  }

  uint64_t capacity() const { return size_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t free_bytes() const { return size_ - used_; }
  uint64_t used_extents() const { return used_count_; }
  uint64_t free_extents() const { return free_count_; }
  uint64_t largest_free() const;
  // 1 - largest_free / free_bytes: 0 when all free space is one extent.
  double fragmentation() const;
  // Walks every block and checks links, sizes and coalescing; for tests.
  bool CheckInvariants() const;

 private:
  static constexpr uint32_t kNone = 0xffffffffu;
  static constexpr int kSlBits = 4;
  static constexpr int kSlCount = 1 << kSlBits;
  static constexpr int kFlCount = 64;
  static constexpr uint64_t kUnit = 64;

  struct Block {
    uint64_t offset;
    uint64_t size;
    uint32_t prev_phys, next_phys;  // address-order neighbours
    uint32_t prev_free, next_free;  // free-list links (free blocks only)
    bool free;
    bool live;     // slot in use
    uint32_t gen;  // bumped each time the slot is reused: stale handles fail
  };
  uint64_t HandleOf(uint32_t b) const { return (uint64_t(blocks_[b].gen) << 32) | b; }

  uint32_t NewBlock();
  void DropBlock(uint32_t b);
  void Insert(uint32_t b);
  void Unlink(uint32_t b);
  static void Mapping(uint64_t size, int* fl, int* sl);
  uint32_t FindFit(uint64_t size) const;
  uint32_t FindFreeContaining(uint64_t offset) const;
  uint32_t SplitOff(uint32_t b, uint64_t size);  // b keeps `size`, rest is new
  // If the block physically after b is free, merges it into b (b not yet in a free list).
  void AbsorbNextIfFree(uint32_t b);
  static uint64_t RoundUpUnit(uint64_t v) { return (v + kUnit - 1) / kUnit * kUnit; }

  uint64_t base_, size_;
  uint64_t used_ = 0, used_count_ = 0, free_count_ = 0;
  // Reserved for max_blocks at construction, grown within that reserve only
  // (no reallocation, pages touched as blocks are first used).
  std::vector<Block> blocks_;
  uint64_t max_blocks_;
  std::vector<uint32_t> spare_;      // block slots freed for reuse
  std::vector<uint32_t> heads_;      // kFlCount * kSlCount free-list heads
  uint64_t fl_bitmap_ = 0;
  uint32_t reserve_hint_ = kNone;
  std::vector<uint32_t> sl_bitmap_;  // per first level
};

}  // namespace mcxl
