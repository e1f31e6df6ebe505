// Two-level segregated fit; see extent_allocator.h for the contract.
#include "mooncake_cxl/pool/extent_allocator.h"

#include <algorithm>
#include <bit>

namespace mcxl {

ExtentAllocator::ExtentAllocator(uint64_t base, uint64_t size, uint64_t max_blocks)
    : base_(base), size_(size / kUnit * kUnit) {
  max_blocks_ = std::max<uint64_t>(max_blocks, 2) + 1;
  blocks_.reserve(max_blocks_);
  spare_.reserve(max_blocks_);
  heads_.assign(kFlCount * kSlCount, kNone);
  sl_bitmap_.assign(kFlCount, 0);
  if (size_ == 0) return;
  uint32_t b = NewBlock();
  blocks_[b].offset = base_;
  blocks_[b].size = size_;
  blocks_[b].prev_phys = blocks_[b].next_phys = kNone;
  Insert(b);
}

uint32_t ExtentAllocator::NewBlock() {
  uint32_t b;
  if (!spare_.empty()) {
    b = spare_.back();
    spare_.pop_back();
  } else if (blocks_.size() < max_blocks_) {
    b = uint32_t(blocks_.size());
    blocks_.emplace_back();  // within the reserve: no reallocation
  } else {
    return kNone;
  }
  uint32_t gen = blocks_[b].gen + 1;
  blocks_[b] = Block{};
  blocks_[b].live = true;
  blocks_[b].gen = gen;
  return b;
}

void ExtentAllocator::DropBlock(uint32_t b) {
  blocks_[b].live = false;
  spare_.push_back(b);
}

void ExtentAllocator::Mapping(uint64_t size, int* fl, int* sl) {
  uint64_t units = size / kUnit;
  if (units < uint64_t(kSlCount)) {
    *fl = 0;
    *sl = int(units);
    return;
  }
  int msb = 63 - std::countl_zero(units);
  *sl = int((units >> (msb - kSlBits)) ^ uint64_t(kSlCount));
  *fl = msb - kSlBits + 1;
}

void ExtentAllocator::Insert(uint32_t b) {
  int fl, sl;
  Mapping(blocks_[b].size, &fl, &sl);
  uint32_t& head = heads_[fl * kSlCount + sl];
  blocks_[b].free = true;
  blocks_[b].prev_free = kNone;
  blocks_[b].next_free = head;
  if (head != kNone) blocks_[head].prev_free = b;
  head = b;
  fl_bitmap_ |= 1ull << fl;
  sl_bitmap_[fl] |= 1u << sl;
  ++free_count_;
}

void ExtentAllocator::Unlink(uint32_t b) {
  int fl, sl;
  Mapping(blocks_[b].size, &fl, &sl);
  Block& blk = blocks_[b];
  if (blk.prev_free != kNone) blocks_[blk.prev_free].next_free = blk.next_free;
  else heads_[fl * kSlCount + sl] = blk.next_free;
  if (blk.next_free != kNone) blocks_[blk.next_free].prev_free = blk.prev_free;
  if (heads_[fl * kSlCount + sl] == kNone) {
    sl_bitmap_[fl] &= ~(1u << sl);
    if (sl_bitmap_[fl] == 0) fl_bitmap_ &= ~(1ull << fl);
  }
  blk.free = false;
  --free_count_;
}

uint32_t ExtentAllocator::FindFit(uint64_t size) const {
  // Good fit: round the request up to the next class boundary so that any
  // block of the class found is large enough, then take the first non-empty
  // class at or above it (two bit scans).
  uint64_t units = size / kUnit;
  uint64_t rounded = size;
  if (units >= uint64_t(kSlCount)) {
    int msb = 63 - std::countl_zero(units);
    rounded = (units + (1ull << (msb - kSlBits)) - 1) * kUnit;
  }
  int fl, sl;
  Mapping(rounded, &fl, &sl);
  if (fl < kFlCount) {
    uint32_t sl_map = sl_bitmap_[fl] & (~0u << sl);
    if (sl_map == 0) {
      uint64_t fl_map = fl + 1 < kFlCount ? fl_bitmap_ & (~0ull << (fl + 1)) : 0;
      if (fl_map != 0) {
        fl = std::countr_zero(fl_map);
        sl_map = sl_bitmap_[fl];
      }
    }
    if (sl_map != 0) return heads_[fl * kSlCount + std::countr_zero(sl_map)];
  }
  // Nothing in the larger classes: a block of the request's own class may
  // still fit. Walk that one list (the pool is nearly full, rare).
  Mapping(size, &fl, &sl);
  for (uint32_t b = heads_[fl * kSlCount + sl]; b != kNone; b = blocks_[b].next_free)
    if (blocks_[b].size >= size) return b;
  return kNone;
}

uint32_t ExtentAllocator::SplitOff(uint32_t b, uint64_t size) {
  // blocks_ never grows, so the reference stays valid across NewBlock.
  Block& blk = blocks_[b];
  if (blk.size - size < kUnit) return kNone;
  uint32_t r = NewBlock();
  if (r == kNone) return kNone;  // out of block slots: keep the slack
  blocks_[r].offset = blk.offset + size;
  blocks_[r].size = blk.size - size;
  blocks_[r].prev_phys = b;
  blocks_[r].next_phys = blk.next_phys;
  if (blk.next_phys != kNone) blocks_[blk.next_phys].prev_phys = r;
  blk.next_phys = r;
  blk.size = size;
  return r;
}

Result<Extent> ExtentAllocator::Allocate(uint64_t size) {
  uint64_t need = RoundUpUnit(size);
  if (need == 0 || need > size_) return ErrorCode::NO_AVAILABLE_HANDLE;
  uint32_t b = FindFit(need);
  if (b == kNone) return ErrorCode::NO_AVAILABLE_HANDLE;
  Unlink(b);
  uint32_t rest = SplitOff(b, need);
  if (rest != kNone) Insert(rest);
  used_ += blocks_[b].size;
  ++used_count_;
  return Extent{blocks_[b].offset, blocks_[b].size, HandleOf(b)};
}

bool ExtentAllocator::Lookup(uint64_t handle, Extent* out) const {
  uint32_t b = uint32_t(handle);
  if (b >= blocks_.size() || !blocks_[b].live || blocks_[b].free || blocks_[b].gen != uint32_t(handle >> 32))
    return false;
  *out = Extent{blocks_[b].offset, blocks_[b].size, handle};
  return true;
}

Status ExtentAllocator::Free(uint64_t handle) {
  uint32_t b = uint32_t(handle);
  if (b >= blocks_.size() || !blocks_[b].live || blocks_[b].free || blocks_[b].gen != uint32_t(handle >> 32))
    return ErrorCode::INVALID_PARAMS;
  ++blocks_[b].gen;  // this handle is spent, even if the block survives the merge
  used_ -= blocks_[b].size;
  --used_count_;
  uint32_t prev = blocks_[b].prev_phys;
  if (prev != kNone && blocks_[prev].free) {  // absorb b into prev
    Unlink(prev);
    blocks_[prev].size += blocks_[b].size;
    blocks_[prev].next_phys = blocks_[b].next_phys;
    if (blocks_[b].next_phys != kNone) blocks_[blocks_[b].next_phys].prev_phys = prev;
    DropBlock(b);
    b = prev;
  }
  AbsorbNextIfFree(b);
  Insert(b);
  return ErrorCode::OK;
}

void ExtentAllocator::AbsorbNextIfFree(uint32_t b) {
  uint32_t next = blocks_[b].next_phys;
  if (next == kNone || !blocks_[next].free) return;
  Unlink(next);
  blocks_[b].size += blocks_[next].size;
  blocks_[b].next_phys = blocks_[next].next_phys;
  if (blocks_[next].next_phys != kNone) blocks_[blocks_[next].next_phys].prev_phys = b;
  DropBlock(next);
}

Status ExtentAllocator::Shrink(uint64_t handle, uint64_t size) {
  uint32_t b = uint32_t(handle);
  if (b >= blocks_.size() || !blocks_[b].live || blocks_[b].free || blocks_[b].gen != uint32_t(handle >> 32))
    return ErrorCode::INVALID_PARAMS;
  uint64_t need = RoundUpUnit(size);
  if (need == 0 || need >= blocks_[b].size) return ErrorCode::OK;
  uint32_t r = SplitOff(b, need);
  if (r == kNone) return ErrorCode::OK;  // out of block slots: keep the slack
  used_ -= blocks_[r].size;
  AbsorbNextIfFree(r);
  Insert(r);
  return ErrorCode::OK;
}

uint32_t ExtentAllocator::FindFreeContaining(uint64_t offset) const {
  // Recovery reserves extents in ascending order, so the block after the last
  // reservation almost always holds the next one.
  auto contains = [&](uint32_t b) {
    return blocks_[b].live && blocks_[b].offset <= offset &&
           offset < blocks_[b].offset + blocks_[b].size;
  };
  if (reserve_hint_ != kNone && blocks_[reserve_hint_].live) {
    for (uint32_t b = reserve_hint_; b != kNone; b = blocks_[b].next_phys)
      if (contains(b)) return b;
  }
  for (uint32_t b = 0; b < blocks_.size(); ++b)
    if (contains(b)) return b;
  return kNone;
}

Result<Extent> ExtentAllocator::Reserve(uint64_t offset, uint64_t size) {
  uint64_t need = RoundUpUnit(size);
  if (need == 0 || offset % kUnit != 0 || offset < base_ || offset + need > base_ + size_)
    return ErrorCode::INVALID_PARAMS;
  uint32_t b = FindFreeContaining(offset);
  if (b == kNone || !blocks_[b].free || blocks_[b].offset + blocks_[b].size < offset + need)
    return ErrorCode::INVALID_PARAMS;
  Unlink(b);
  if (blocks_[b].offset < offset) {  // keep the left part free
    uint32_t right = SplitOff(b, offset - blocks_[b].offset);
    if (right == kNone) {
      Insert(b);
      return ErrorCode::INTERNAL_ERROR;
    }
    Insert(b);
    b = right;
  }
  uint32_t rest = SplitOff(b, need);
  if (rest != kNone) Insert(rest);
  used_ += blocks_[b].size;
  ++used_count_;
  reserve_hint_ = b;
  return Extent{blocks_[b].offset, blocks_[b].size, HandleOf(b)};
}

uint64_t ExtentAllocator::largest_free() const {
  if (fl_bitmap_ == 0) return 0;
  int fl = 63 - std::countl_zero(fl_bitmap_);
  int sl = 31 - std::countl_zero(sl_bitmap_[fl]);
  uint64_t best = 0;
  for (uint32_t b = heads_[fl * kSlCount + sl]; b != kNone; b = blocks_[b].next_free)
    best = std::max(best, blocks_[b].size);
  return best;
}

double ExtentAllocator::fragmentation() const {
  uint64_t free = free_bytes();
  return free == 0 ? 0.0 : 1.0 - double(largest_free()) / double(free);
}

bool ExtentAllocator::CheckInvariants() const {
  // Find the first block (no prev_phys) and walk address order.
  uint32_t first = kNone;
  uint64_t live = 0;
  for (uint32_t b = 0; b < blocks_.size(); ++b) {
    if (!blocks_[b].live) continue;
    ++live;
    if (blocks_[b].prev_phys == kNone) {
      if (first != kNone) return false;
      first = b;
    }
  }
  if (size_ == 0) return live == 0;
  uint64_t expect = base_, used = 0, n = 0, nfree = 0;
  bool prev_free = false;
  for (uint32_t b = first; b != kNone; b = blocks_[b].next_phys) {
    const Block& blk = blocks_[b];
    if (blk.offset != expect || blk.size == 0 || blk.size % kUnit != 0) return false;
    if (blk.free && prev_free) return false;  // neighbours must be coalesced
    if (blk.next_phys != kNone && blocks_[blk.next_phys].prev_phys != b) return false;
    if (!blk.free) used += blk.size;
    else ++nfree;
    prev_free = blk.free;
    expect += blk.size;
    if (++n > live) return false;
  }
  return expect == base_ + size_ && n == live && used == used_ && nfree == free_count_;
}

}  // namespace mcxl
