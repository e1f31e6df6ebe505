// KeyHash: the 64-bit hash that places a key in the object index.
//
// Contract: deterministic across processes, hosts and builds (it is part of
// the pool layout: changing it requires a new layout version). Never 0, so 0
// can mean "no hash" in an entry.
#pragma once

#include <cstdint>
#include <string_view>

namespace mcxl {

uint64_t KeyHash(std::string_view key);

}  // namespace mcxl
