// Copies of large values into and out of the pool (client-side; not a public
// header).
//
// Contract: StreamToPool(dst, src, n) and CopyFromPool(dst, src, n) copy n
// bytes like memcpy (no overlap, any alignment, any length). StreamToPool
// uses non-temporal stores (callers use it for values of kStreamToPoolMin
// bytes and more, every part of them); when it returns, its stores are
// ordered before any later store (sfence), so the caller's PublishRange +
// release store still announce complete data.
//
// Why not memcpy: glibc sizes its copy strategy
// from the CPUID cache sizes; on VMs that report a huge shared cache (this
// one: 320 MiB) it never switches to non-temporal stores below 240 MiB, so a
// 4 MiB put into cold pool lines pays a read-for-ownership per line and
// evicts the writer's cache (median 2.2x slower than streaming, and the put's
// latency then depends on what else ran on the core: the tail). A value put
// into the pool is read by other processes or hosts, not by the writer, so
// from kStreamToPoolMin up the copy streams. Reads land in caller memory the
// caller reads next: regular stores, but a 64-byte vector loop instead of the
// `rep movsb` glibc picks for 2 KiB .. L2-sized copies, which reads cold
// pool pages ~5-10% slower on this class of machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define MCXL_POOL_COPY_SSE2 1
#endif

namespace mcxl {

constexpr size_t kStreamToPoolMin = size_t(1) << 20;  // below: the lines may be read soon from cache
constexpr size_t kVectorFromPoolMin = size_t(16) << 10;  // below: memcpy's small-size paths win

#ifdef MCXL_POOL_COPY_SSE2
namespace pool_copy_detail {
// Copies whole 64-byte lines (four 16-byte loads, then four stores:
// non-temporal when kStream) while n >= 64; advances d, s and n.
template <bool kStream>
inline void CopyLines(char*& d, const char*& s, size_t& n) {
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * k));
    for (int k = 0; k < 4; ++k) {
      if constexpr (kStream) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
    }
  }
}
}  // namespace pool_copy_detail
#endif

inline void StreamToPool(void* dst, const void* src, size_t n) {
#ifdef MCXL_POOL_COPY_SSE2
  if (n >= 128) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;  // to a whole line
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    pool_copy_detail::CopyLines<true>(d, s, n);  // d is line-aligned: whole-line streams
    // Non-temporal stores are weakly ordered: without the fence a later
    // plain store (the publishing one) could become visible before them.
    _mm_sfence();
    memcpy(d, s, n);
    return;
  }
#endif
  memcpy(dst, src, n);
}

inline void CopyFromPool(void* dst, const void* src, size_t n) {
#ifdef MCXL_POOL_COPY_SSE2
  if (n >= kVectorFromPoolMin) {
    char* d = static_cast<char*>(dst);
    const char* s = static_cast<const char*>(src);
    pool_copy_detail::CopyLines<false>(d, s, n);
    memcpy(d, s, n);
    return;
  }
#endif
  memcpy(dst, src, n);
}

}  // namespace mcxl
