// ObjectHeader helpers: how the master writes the header at the start of an
// extent and how recovery checks one it did not write in this incarnation.
//
// Contract: WriteObjectHeader fills header + key and publishes them (the
// index entry that points here is inserted afterwards). CheckedObjectHeader
// returns the header at `offset` only when it lies in the data region, has
// the magic, a key within bounds, an extent that holds header + value, and a
// matching checksum; otherwise nullptr.
#pragma once

#include <cstdint>
#include <string_view>

#include "mooncake_cxl/layout.h"
#include "mooncake_cxl/pool.h"

namespace mcxl {

struct ObjectHeaderFields {
  uint64_t key_hash = 0, generation = 0, value_size = 0, extent_size = 0;
  uint64_t put_time_ns = 0, group_hash = 0, soft_pin_ttl_ms = 0;
  uint32_t flags = 0;
};

void WriteObjectHeader(const Pool& pool, uint64_t offset, const ObjectHeaderFields& f,
                       std::string_view key);
const ObjectHeader* CheckedObjectHeader(const Pool& pool, uint64_t offset);

}  // namespace mcxl
