// ExtentAllocator: a long random alloc/free run checked against a reference
// model (alignment, no overlap, bounds, byte accounting, invariants, full
// coalescing at the end, fragmentation at peak occupancy), refilling freed
// space with extents of another size, exact fits, Reserve() for recovery, and
// the error paths (stale/unknown handles, zero and oversize requests).
#include "mooncake_cxl/pool/extent_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <vector>

namespace mcxl {
namespace {

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

struct Snapshot {
  uint64_t used, used_extents, free_extents, largest;
  bool operator==(const Snapshot&) const = default;
};
Snapshot Snap(const ExtentAllocator& a) {
  return {a.used_bytes(), a.used_extents(), a.free_extents(), a.largest_free()};
}

// Live extents, offset -> {size, handle}; checks every new extent against it.
class Model {
 public:
  Model(uint64_t base, uint64_t size) : base_(base), size_(size) {}

  void Add(const Extent& e) {
    ASSERT_EQ(e.offset % 64, 0u);
    ASSERT_EQ(e.size % 64, 0u);
    ASSERT_GE(e.offset, base_);
    ASSERT_LE(e.offset + e.size, base_ + size_);
    auto next = live_.lower_bound(e.offset);
    if (next != live_.end()) {
      ASSERT_LE(e.offset + e.size, next->first) << "overlaps the next extent";
    }
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second.size, e.offset) << "overlaps the previous extent";
    }
    live_[e.offset] = e;
    used_ += e.size;
  }
  Extent Remove(uint64_t offset) {
    Extent e = live_.at(offset);
    live_.erase(offset);
    used_ -= e.size;
    return e;
  }
  const std::map<uint64_t, Extent>& live() const { return live_; }
  uint64_t used() const { return used_; }

 private:
  uint64_t base_, size_, used_ = 0;
  std::map<uint64_t, Extent> live_;
};

// 64 B .. 4 MiB, log-uniform, not always a multiple of 64.
uint64_t RandomSize(std::mt19937_64& rng) {
  int shift = int(rng() % 17);  // 2^6 .. 2^22
  uint64_t lo = 64ull << shift;
  uint64_t size = lo + rng() % lo;
  return std::min<uint64_t>(size, 4 * kMiB);
}

TEST(ExtentAllocatorTest, RandomOpsAgainstModel) {
  const uint64_t base = 1 * kMiB, size = 256 * kMiB;
  ExtentAllocator a(base, size, 100000);
  Model model(base, size);
  std::mt19937_64 rng(20240601);
  ASSERT_EQ(a.capacity(), size);
  ASSERT_TRUE(a.CheckInvariants());

  std::vector<uint64_t> offsets;  // of live extents, for O(1) random pick
  uint64_t last_freed_size = 0, peak_used = 0, failures = 0, exact_fits = 0;
  double frag_at_peak = 0, occupancy_at_failure_sum = 0;
  const int kOps = 200000;
  for (int i = 0; i < kOps; ++i) {
    // Alternate filling and draining phases so the pool runs full repeatedly.
    double p_alloc = (i / 20000) % 2 == 0 ? 0.65 : 0.4;
    bool do_alloc = offsets.empty() || std::uniform_real_distribution<>(0, 1)(rng) < p_alloc;
    if (do_alloc) {
      bool exact = last_freed_size != 0 && rng() % 10 == 0;
      uint64_t want = exact ? last_freed_size : RandomSize(rng);
      exact_fits += exact;
      uint64_t largest_before = a.largest_free();
      auto r = a.Allocate(want);
      if (!r.ok()) {
        ASSERT_EQ(r.error(), ErrorCode::NO_AVAILABLE_HANDLE);
        // Good fit plus the fallback walk: failure only when nothing fits.
        ASSERT_LT(largest_before, (want + 63) / 64 * 64) << "op " << i;
        ++failures;
        occupancy_at_failure_sum += double(a.used_bytes()) / double(size);
      } else {
        ASSERT_EQ(r->size, (want + 63) / 64 * 64) << "op " << i;  // block slots are ample
        model.Add(*r);
        if (HasFatalFailure()) {
          return;
        }
        offsets.push_back(r->offset);
      }
    } else {
      size_t pick = rng() % offsets.size();
      Extent e = model.Remove(offsets[pick]);
      offsets[pick] = offsets.back();
      offsets.pop_back();
      ASSERT_TRUE(a.Free(e.handle).ok()) << "op " << i;
      last_freed_size = e.size;
    }
    ASSERT_EQ(a.used_bytes(), model.used()) << "op " << i;
    ASSERT_EQ(a.used_extents(), model.live().size()) << "op " << i;
    if (a.used_bytes() > peak_used) {
      peak_used = a.used_bytes();
      frag_at_peak = a.fragmentation();
    }
    if (i % 1000 == 0) {
      ASSERT_TRUE(a.CheckInvariants()) << "op " << i;
    }
  }
  EXPECT_GT(failures, 0u) << "the run never filled the pool";
  EXPECT_GT(exact_fits, 0u);

  double mean_fail_occupancy = failures ? occupancy_at_failure_sum / double(failures) : 0;
  std::cout << "peak occupancy " << double(peak_used) / double(size) * 100
            << "%, fragmentation() at peak " << frag_at_peak << " (free "
            << (size - peak_used) / 1024 << " KiB), " << failures
            << " allocation failures at mean occupancy " << mean_fail_occupancy * 100 << "%\n";
  RecordProperty("peak_used_bytes", std::to_string(peak_used));
  RecordProperty("fragmentation_at_peak", std::to_string(frag_at_peak));
  RecordProperty("mean_occupancy_at_failure", std::to_string(mean_fail_occupancy));

  for (const auto& [off, e] : model.live()) ASSERT_TRUE(a.Free(e.handle).ok());
  EXPECT_TRUE(a.CheckInvariants());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.used_extents(), 0u);
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.largest_free(), a.capacity());
  EXPECT_EQ(a.fragmentation(), 0.0);
}

// Fills the allocator with extents of `size` until one fails; returns them.
std::vector<Extent> Fill(ExtentAllocator& a, uint64_t size) {
  std::vector<Extent> out;
  for (;;) {
    auto r = a.Allocate(size);
    if (!r.ok()) break;
    out.push_back(*r);
  }
  return out;
}

void RefillWithOtherSize(uint64_t first, uint64_t second) {
  // Capacity not a multiple of either size, so both fills leave some slack.
  const uint64_t cap = 256 * kMiB + 3 * 64 * kKiB + 4 * kKiB;
  ExtentAllocator a(4096, cap, 2 * cap / (64 * kKiB) + 16);
  auto one = Fill(a, first);
  uint64_t first_bytes = a.used_bytes();
  ASSERT_FALSE(one.empty());
  for (const Extent& e : one) ASSERT_TRUE(a.Free(e.handle).ok());
  ASSERT_EQ(a.free_extents(), 1u);
  auto two = Fill(a, second);
  uint64_t second_bytes = a.used_bytes();
  EXPECT_GE(double(second_bytes), 0.9 * double(first_bytes))
      << first << " B fill reached " << first_bytes << ", " << second << " B fill " << second_bytes;
  EXPECT_TRUE(a.CheckInvariants());
  for (const Extent& e : two) ASSERT_TRUE(a.Free(e.handle).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free(), cap);
}

TEST(ExtentAllocatorTest, LargeThenSmallReusesFreedSpace) { RefillWithOtherSize(4 * kMiB, 64 * kKiB); }
TEST(ExtentAllocatorTest, SmallThenLargeReusesFreedSpace) { RefillWithOtherSize(64 * kKiB, 4 * kMiB); }

TEST(ExtentAllocatorTest, ExactFitIntoTheOnlyHole) {
  // 3000 B rounds to 3008, which is not a size-class boundary: good fit alone
  // would skip the hole, the fallback walk must find it.
  const uint64_t item = 3008;
  ExtentAllocator a(0, 100 * item, 1000);
  auto all = Fill(a, 3000);
  ASSERT_EQ(all.size(), 100u);
  ASSERT_EQ(a.free_bytes(), 0u);
  ASSERT_TRUE(a.Free(all[42].handle).ok());
  auto too_big = a.Allocate(item + 1);
  EXPECT_EQ(too_big.error(), ErrorCode::NO_AVAILABLE_HANDLE);
  auto r = a.Allocate(item);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->offset, all[42].offset);
  EXPECT_EQ(r->size, item);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(ExtentAllocatorTest, FreeCoalescesBothNeighbours) {
  ExtentAllocator a(0, 1 * kMiB, 100);
  auto x = a.Allocate(4096), y = a.Allocate(4096), z = a.Allocate(4096), w = a.Allocate(4096);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok() && w.ok());
  ASSERT_TRUE(a.Free(x->handle).ok());
  ASSERT_TRUE(a.Free(z->handle).ok());
  EXPECT_EQ(a.free_extents(), 3u);  // x, z, tail
  ASSERT_TRUE(a.Free(y->handle).ok());  // joins x and z
  EXPECT_EQ(a.free_extents(), 2u);
  EXPECT_EQ(a.largest_free(), 1 * kMiB - 4 * 4096);
  ASSERT_TRUE(a.Free(w->handle).ok());
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.largest_free(), 1 * kMiB);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(ExtentAllocatorTest, ReserveRejectsOverlapAndLeavesStateUnchanged) {
  const uint64_t base = 64 * kKiB;
  ExtentAllocator a(base, 16 * kMiB, 1000);
  auto r1 = a.Reserve(base + 1 * kMiB, 100 * kKiB);
  auto r2 = a.Reserve(base + 2 * kMiB, 64);
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ(r1->offset, base + 1 * kMiB);
  EXPECT_EQ(r1->size, 100 * kKiB);
  auto alloc = a.Allocate(8 * kKiB);
  ASSERT_TRUE(alloc.ok());
  Snapshot before = Snap(a);

  struct Case { uint64_t off, size; };
  const Case bad[] = {
      {base + 1 * kMiB, 64},                          // same start
      {base + 1 * kMiB + 4096, 64},                   // inside
      {base + 1 * kMiB - 64, 128},                    // overlaps its head
      {base + 1 * kMiB + 100 * kKiB - 64, 4096},      // overlaps its tail
      {base + 1 * kMiB - 4096, 200 * kKiB},           // covers it
      {base + 2 * kMiB - 64, 4096},                   // overlaps the second
      {alloc->offset, 64},                            // an allocated extent
      {base - 64, 128},                               // below the range
      {base + 16 * kMiB - 64, 128},                   // past the end
      {base + 3 * kMiB + 1, 64},                      // misaligned
      {base + 3 * kMiB, 0},                           // empty
      {~uint64_t(63), 128},                           // offset + size wraps
  };
  for (const Case& c : bad) {
    auto r = a.Reserve(c.off, c.size);
    EXPECT_FALSE(r.ok()) << "reserve " << c.off << "+" << c.size;
    EXPECT_EQ(Snap(a), before);
    ASSERT_TRUE(a.CheckInvariants());
  }
  // Adjacent (touching, not overlapping) ranges are fine.
  auto adj = a.Reserve(base + 2 * kMiB - 64, 64);
  ASSERT_TRUE(adj.ok());
  for (uint64_t h : {r1->handle, r2->handle, alloc->handle, adj->handle}) ASSERT_TRUE(a.Free(h).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_TRUE(a.CheckInvariants());
}

TEST(ExtentAllocatorTest, ReserveInAscendingOrderLikeRecovery) {
  ExtentAllocator a(0, 64 * kMiB, 10000);
  std::mt19937_64 rng(7);
  std::vector<Extent> kept;
  uint64_t off = 0, expect_used = 0;
  while (true) {
    off += (rng() % 4) * 4096;  // gaps
    uint64_t size = 64 * (1 + rng() % 2000);
    if (off + size > a.capacity()) break;
    auto r = a.Reserve(off, size);
    ASSERT_TRUE(r.ok()) << off;
    ASSERT_EQ(r->offset, off);
    kept.push_back(*r);
    expect_used += r->size;
    off += r->size;
  }
  EXPECT_EQ(a.used_bytes(), expect_used);
  EXPECT_TRUE(a.CheckInvariants());
  for (const Extent& e : kept) ASSERT_TRUE(a.Free(e.handle).ok());
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_EQ(a.largest_free(), a.capacity());
}

TEST(ExtentAllocatorTest, FreeOfStaleOrUnknownHandleChangesNothing) {
  ExtentAllocator a(0, 4 * kMiB, 64);
  auto x = a.Allocate(1000), y = a.Allocate(5000);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(a.Free(x->handle).ok());
  Snapshot before = Snap(a);
  EXPECT_EQ(a.Free(x->handle).error(), ErrorCode::INVALID_PARAMS);  // double free
  EXPECT_EQ(Snap(a), before);
  for (uint32_t h : {63u, 64u, 65u, 1000u, 0xfffffffeu, 0xffffffffu}) {
    if (h == y->handle) continue;
    EXPECT_EQ(a.Free(h).error(), ErrorCode::INVALID_PARAMS) << h;
    EXPECT_EQ(Snap(a), before);
  }
  EXPECT_TRUE(a.CheckInvariants());
  ASSERT_TRUE(a.Free(y->handle).ok());
  EXPECT_EQ(a.Free(y->handle).error(), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_extents(), 1u);
}

// Contract (extent_allocator.h): "a stale ... handle is INVALID_PARAMS,
// nothing changes", also once the freed block is handed out again.
TEST(ExtentAllocatorTest, StaleHandleAfterSlotReuseIsRejected) {
  ExtentAllocator a(0, 4 * kMiB, 64);
  auto x = a.Allocate(4096);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(a.Free(x->handle).ok());
  auto y = a.Allocate(4096);  // a different object
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(a.Free(x->handle).error(), ErrorCode::INVALID_PARAMS) << "stale handle freed y's extent";
  EXPECT_EQ(a.used_bytes(), 4096u);
}

TEST(ExtentAllocatorTest, ZeroAndOversizeRequestsFail) {
  ExtentAllocator a(128, 8 * kMiB, 64);
  Snapshot before = Snap(a);
  for (uint64_t want : {uint64_t(0), 8 * kMiB + 1, 16 * kMiB, ~uint64_t(0), ~uint64_t(0) - 63,
                        ~uint64_t(0) - 64}) {
    auto r = a.Allocate(want);
    EXPECT_EQ(r.error(), ErrorCode::NO_AVAILABLE_HANDLE) << want;
    EXPECT_EQ(Snap(a), before);
  }
  auto all = a.Allocate(8 * kMiB);  // exactly the capacity
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->offset, 128u);
  EXPECT_EQ(a.Allocate(64).error(), ErrorCode::NO_AVAILABLE_HANDLE);
  EXPECT_EQ(a.fragmentation(), 0.0);
}

TEST(ExtentAllocatorTest, RunsOutOfBlockSlotsGracefully) {
  // max_blocks bounds used + free blocks: an allocation without a slot for
  // the remainder keeps the slack instead of failing or corrupting state.
  ExtentAllocator a(0, 1 * kMiB, 4);
  std::vector<Extent> got = Fill(a, 4096);
  ASSERT_FALSE(got.empty());
  EXPECT_TRUE(a.CheckInvariants());
  uint64_t sum = 0;
  for (const Extent& e : got) sum += e.size;
  EXPECT_EQ(sum, a.used_bytes());
  for (const Extent& e : got) ASSERT_TRUE(a.Free(e.handle).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.free_extents(), 1u);
  EXPECT_TRUE(a.CheckInvariants());
}


// Shrink (the SSD tier turns a demoted object's extent into its stub): the
// tail is free and coalesces; the handle stays valid; a whole free is exact.
TEST(ExtentAllocatorTest, ShrinkFreesTheTailAndCoalesces) {
  ExtentAllocator a(4096, 4 * kMiB, 64);
  auto x = a.Allocate(kMiB);
  auto y = a.Allocate(kMiB);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(a.Free(y->handle).ok());
  ASSERT_TRUE(a.Shrink(x->handle, 100).ok());
  Extent e;
  ASSERT_TRUE(a.Lookup(x->handle, &e));
  EXPECT_EQ(e.size, 128u);
  EXPECT_EQ(a.used_bytes(), 128u);
  EXPECT_EQ(a.largest_free(), 4 * kMiB - 128);  // the tail merged with all free space after it
  EXPECT_TRUE(a.CheckInvariants());
  EXPECT_EQ(a.Shrink(y->handle, 64).error(), ErrorCode::INVALID_PARAMS);  // a freed handle
  ASSERT_TRUE(a.Free(x->handle).ok());
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free(), 4 * kMiB);
  EXPECT_TRUE(a.CheckInvariants());
}

}  // namespace
}  // namespace mcxl
