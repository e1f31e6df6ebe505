#include "mooncake_cxl/pool/object_header.h"

#include <cstring>

#include "mooncake_cxl/pool/key_hash.h"
#include "mooncake_cxl/pool/publish.h"

namespace mcxl {
namespace {
// Over every byte before the checksum field of `fixed`, and the key (by
// its KeyHash).
uint32_t HeaderChecksum(const ObjectHeader* fixed, uint64_t key_hash_of_key) {
  std::string_view f(reinterpret_cast<const char*>(fixed), offsetof(ObjectHeader, header_checksum));
  return uint32_t(KeyHash(f) ^ (key_hash_of_key >> 17));
}
}  // namespace

void WriteObjectHeader(const Pool& pool, uint64_t offset, const ObjectHeaderFields& f, std::string_view key,
                       uint64_t key_hash_of_key) {
  auto* h = pool.At<ObjectHeader>(offset);
  // The extent's lines may be in this host's cache from an earlier object
  // another host wrote: dropped first, so the write-back below is based on
  // the pool's bytes (a non-coherent pool; a fence when coherent).
  ObserveRange(h, sizeof(ObjectHeader) + key.size());
  h->magic = kObjectMagic;
  h->key_hash = f.key_hash;
  h->generation = f.generation;
  h->value_size = f.value_size;
  h->extent_size = f.extent_size;
  h->put_time_ns = f.put_time_ns;
  h->group_hash = f.group_hash;
  h->soft_pin_ttl_ms = f.soft_pin_ttl_ms;
  h->key_len = uint32_t(key.size());
  h->flags = f.flags;
  h->reserved = 0;
  memcpy(reinterpret_cast<char*>(h + 1), key.data(), key.size());
  h->header_checksum = HeaderChecksum(h, key_hash_of_key != 0 ? key_hash_of_key : KeyHash(key));
  PublishRange(h, sizeof(ObjectHeader) + key.size());
}

bool HeaderInBounds(const Pool& pool, uint64_t offset, uint64_t key_len) {
  return offset % kCacheLine == 0 && key_len <= kMaxKeyLength &&
         pool.InDataRegion(offset, ObjectHeaderBytes(key_len));
}

bool CheckedObjectHeader(const Pool& pool, uint64_t offset, ObjectHeader* out) {
  if (!HeaderInBounds(pool, offset, 0)) return false;
  const auto* h = pool.At<const ObjectHeader>(offset);
  ObserveRange(h, sizeof(ObjectHeader));
  memcpy(out, h, sizeof(ObjectHeader));  // one read; only the copy is checked and used
  const ObjectHeader& c = *out;
  uint64_t data_size = pool.geometry().data_size;
  if (c.magic != kObjectMagic || c.key_len == 0 || !HeaderInBounds(pool, offset, c.key_len)) return false;
  // value_size first: ExtentBytes must not wrap. A stub (kOnDisk,
  // kInSegment) holds a DiskStub or SegmentStub where the value would be.
  uint64_t held = (c.flags & kFlagDiskStub)      ? sizeof(DiskStub)
                  : (c.flags & kFlagSegmentStub) ? sizeof(SegmentStub)
                                                 : c.value_size;
  if (c.value_size == 0 || c.value_size > data_size || c.extent_size < ExtentBytes(c.key_len, held) ||
      !pool.InDataRegion(offset, c.extent_size))
    return false;
  ObserveRange(h + 1, c.key_len);
  return HeaderChecksum(&c, KeyHash(std::string_view(reinterpret_cast<const char*>(h + 1), c.key_len))) ==
         c.header_checksum;
}

}  // namespace mcxl
