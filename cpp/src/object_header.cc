#include "mooncake_cxl/object_header.h"

#include <cstring>

#include "mooncake_cxl/key_hash.h"
#include "mooncake_cxl/publish.h"

namespace mcxl {
namespace {
uint32_t HeaderChecksum(const ObjectHeader* h) {
  // Over every byte before the checksum field, and the key.
  std::string_view fixed(reinterpret_cast<const char*>(h), offsetof(ObjectHeader, header_checksum));
  std::string_view key(reinterpret_cast<const char*>(h + 1), h->key_len);
  return uint32_t(KeyHash(fixed) ^ (KeyHash(key) >> 17));
}
}  // namespace

void WriteObjectHeader(const Pool& pool, uint64_t offset, const ObjectHeaderFields& f,
                       std::string_view key) {
  auto* h = pool.At<ObjectHeader>(offset);
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
  h->header_checksum = HeaderChecksum(h);
  PublishRange(h, sizeof(ObjectHeader) + key.size());
}

const ObjectHeader* CheckedObjectHeader(const Pool& pool, uint64_t offset) {
  if (offset % kCacheLine != 0 || !pool.InDataRegion(offset, sizeof(ObjectHeader))) return nullptr;
  const auto* h = pool.At<const ObjectHeader>(offset);
  ObserveRange(h, sizeof(ObjectHeader));
  if (h->magic != kObjectMagic || h->key_len == 0 || h->key_len > kMaxKeyLength) return nullptr;
  if (!pool.InDataRegion(offset, ObjectHeaderBytes(h->key_len))) return nullptr;
  if (h->extent_size < ExtentBytes(h->key_len, h->value_size) || h->value_size == 0 ||
      !pool.InDataRegion(offset, h->extent_size))
    return nullptr;
  ObserveRange(h + 1, h->key_len);
  if (HeaderChecksum(h) != h->header_checksum) return nullptr;
  return h;
}

}  // namespace mcxl
