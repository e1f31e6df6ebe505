// ObjectHeader helpers: how the master writes the header at the start of an
// extent, and the checked ways anyone reads one back.
//
// Contract: WriteObjectHeader fills header + key and publishes them (the
// index entry that points here is inserted afterwards). A header is in
// memory every client can write, so nothing in it is used before a check:
//   * HeaderInBounds: the header and a key of `key_len` bytes at `offset`
//     lie in the data region (64-aligned). A reader that compares a key it
//     already knows (its own length, never the header's) needs only this.
//   * CheckedObjectHeader: a copy of the header, taken once (so a concurrent
//     store cannot change it between check and use), returned only when it
//     lies in the data region, has the magic, a key within bounds, a value
//     and an extent that fit the data region, and a matching checksum.
//     Recovery uses it; the running master trusts its own records instead
//     (Master::CheckedLive).
#pragma once

#include <cstdint>
#include <string_view>

#include "mooncake_cxl/pool/layout.h"
#include "mooncake_cxl/pool/pool.h"

namespace mcxl {

struct ObjectHeaderFields {
  uint64_t key_hash = 0, generation = 0, value_size = 0, extent_size = 0;
  uint64_t put_time_ns = 0, group_hash = 0, soft_pin_ttl_ms = 0;
  uint32_t flags = 0;
};

// key_hash_of_key: KeyHash(key) when the caller has it (the put path),
// else 0 and it is computed here.
void WriteObjectHeader(const Pool& pool, uint64_t offset, const ObjectHeaderFields& f, std::string_view key,
                       uint64_t key_hash_of_key = 0);
bool HeaderInBounds(const Pool& pool, uint64_t offset, uint64_t key_len);
bool CheckedObjectHeader(const Pool& pool, uint64_t offset, ObjectHeader* out);

}  // namespace mcxl
