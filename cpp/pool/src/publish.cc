#include "mooncake_cxl/pool/publish.h"

#include <cpuid.h>
#include <immintrin.h>

#include "mooncake_cxl/common/sim_mutation.h"
#include "mooncake_cxl/pool/coherence_sim.h"

namespace mcxl {

namespace publish_detail {
std::atomic<uint32_t> g_line_path{uint32_t(LinePath::kFences)};
}  // namespace publish_detail

namespace {

// Relaxed: written once at attach, before any pool access by this process.
std::atomic<uint32_t> g_mode{uint32_t(CoherenceMode::kCoherent)};

constexpr uintptr_t kLine = kCacheLine;

__attribute__((target("clwb"))) void WriteBackClwb(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  for (auto end = reinterpret_cast<uintptr_t>(p) + n; a < end; a += kLine)
    _mm_clwb(reinterpret_cast<void*>(a));
  _mm_sfence();  // the write-backs complete before the announcing store
}

__attribute__((target("clflushopt"))) void FlushOpt(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  for (auto end = reinterpret_cast<uintptr_t>(p) + n; a < end; a += kLine)
    _mm_clflushopt(reinterpret_cast<void*>(a));
}

void FlushLegacy(const void* p, size_t n) {
  auto a = reinterpret_cast<uintptr_t>(p) & ~(kLine - 1);
  for (auto end = reinterpret_cast<uintptr_t>(p) + n; a < end; a += kLine)
    _mm_clflush(reinterpret_cast<const void*>(a));
}

struct LineOps {
  void (*write_back)(const void*, size_t);
  void (*flush)(const void*, size_t);  // write back if dirty, then evict
  const char* write_back_name;
};

LineOps PickLineOps() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  bool leaf7 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) != 0;
  bool clflushopt = leaf7 && (ebx & (1u << 23)) != 0;
  bool clwb = leaf7 && (ebx & (1u << 24)) != 0;
  auto flush = clflushopt ? FlushOpt : FlushLegacy;
  if (clwb) return {WriteBackClwb, flush, "clwb"};
  if (clflushopt) return {[](const void* p, size_t n) { FlushOpt(p, n), _mm_sfence(); }, flush, "clflushopt"};
  return {[](const void* p, size_t n) { FlushLegacy(p, n), _mm_sfence(); }, flush, "clflush"};
}

const LineOps& Ops() {
  static const LineOps ops = PickLineOps();  // CPUID once
  return ops;
}

LinePath Path() { return LinePath(publish_detail::g_line_path.load(std::memory_order_relaxed)); }

}  // namespace

void SetCoherenceMode(CoherenceMode mode) {
  g_mode.store(uint32_t(mode), std::memory_order_relaxed);
  LinePath path = LinePath::kFences;
  if (mode == CoherenceMode::kNonCoherent) {
    path = SimHost::HostFromEnv() >= 0 ? LinePath::kSimulated : LinePath::kCacheLineOps;
    Ops();
  }
  publish_detail::g_line_path.store(uint32_t(path), std::memory_order_relaxed);
  LoadSimMutation(mode == CoherenceMode::kNonCoherent);
}

CoherenceMode GetCoherenceMode() { return CoherenceMode(g_mode.load(std::memory_order_relaxed)); }

LinePath GetLinePath() { return Path(); }

const char* WriteBackInstruction() { return Ops().write_back_name; }

void CacheLineWriteBack(const void* p, size_t n) { Ops().write_back(p, n); }

void CacheLineEvict(const void* p, size_t n) {
  Ops().flush(p, n);
  _mm_mfence();  // the evictions complete before the loads that follow
}

namespace publish_detail {

void WriteBackSlow(const void* p, size_t n) {
  if (Path() == LinePath::kSimulated) {
    if (SimHost* s = SimHostOf(p)) s->WriteBack(p, n);
    return;  // outside every host copy: private memory, nothing to move
  }
  CacheLineWriteBack(p, n);
}

void InvalidateSlow(const void* p, size_t n) {
  if (Path() == LinePath::kSimulated) {
    if (SimHost* s = SimHostOf(p)) s->Invalidate(p, n);
    return;
  }
  CacheLineEvict(p, n);
}

}  // namespace publish_detail
}  // namespace mcxl
