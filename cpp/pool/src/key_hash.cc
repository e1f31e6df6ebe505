// A multiply-xorshift hash over 8-byte words: fast for the short keys of KV
// caches (tens to hundreds of bytes) and well mixed in the low bits, which
// pick the index slot.
#include "mooncake_cxl/pool/key_hash.h"

#include <cstring>

namespace mcxl {
namespace {
constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
inline uint64_t Mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}
}  // namespace

uint64_t KeyHash(std::string_view key) {
  uint64_t h = 0x243F6A8885A308D3ull ^ (key.size() * kMul);
  const char* p = key.data();
  size_t n = key.size();
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ Mix(w)) * kMul;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ Mix(w ^ (uint64_t(n) << 56))) * kMul;
  }
  h = Mix(h);
  return h == 0 ? 1 : h;
}

}  // namespace mcxl
