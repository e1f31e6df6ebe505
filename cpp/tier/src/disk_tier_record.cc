// SSD tier record images: a record's header, its bytes in the file (header,
// key, value, zero padding to the block), and their writing: one record
// streamed in chunks with its header last (ImageWriter), or many packed
// into one buffer for one write. Format: disk_tier.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "disk_tier_internal.h"

namespace mcxl::tier {

void ImageWriter::Put(uint64_t pos, uint8_t* data, uint64_t n) {
  if (err != 0 || n == 0) return;
  if (pos == 0 && n >= total) {
    single = data;  // written whole by Finish
    return;
  }
  if (pos == 0) {
    memcpy(block0, data, kBlockSize);
    data += kBlockSize;
    n -= kBlockSize;
    pos = kBlockSize;
  }
  err = PwriteFull(fd, data, n, base + pos);
}

int ImageWriter::Finish(const RecordHeader& h) {
  if (err != 0) return err;
  uint8_t* first = single != nullptr ? single : block0;
  memcpy(first, &h, sizeof(h));
  err = PwriteFull(fd, first, single != nullptr ? total : kBlockSize, base);
  return err;
}

RecordHeader NewRecordHeader(uint16_t kind, std::string_view key, uint32_t seg, uint64_t off,
                             uint64_t value_len, uint64_t generation, uint64_t seq) {
  RecordHeader h{};
  h.magic = kRecordMagic;
  h.version = kFormatVersion;
  h.kind = kind;
  h.key_len = uint32_t(key.size());
  h.segment_id = seg;
  h.offset = off;
  h.value_len = value_len;
  h.generation = generation;
  h.seq = seq;
  h.key_crc = Crc32c(key.data(), key.size());
  return h;
}

void FillImage(uint8_t* out, uint64_t pos, uint64_t n, std::string_view key, const uint8_t* value,
               uint64_t len, uint32_t* crc) {
  memset(out, 0, n);
  const uint64_t kb = kHeaderBytes, vb = kHeaderBytes + key.size(), ve = vb + len;
  const uint64_t end = pos + n;
  uint64_t a = std::max(pos, kb), b = std::min(end, vb);
  if (a < b) memcpy(out + (a - pos), key.data() + (a - kb), b - a);
  a = std::max(pos, vb);
  b = std::min(end, ve);
  if (a < b) {
    memcpy(out + (a - pos), value + (a - vb), b - a);
    *crc = Crc32c(out + (a - pos), b - a, *crc);  // crc of exactly the bytes written
  }
}

int WriteImage(int fd, uint8_t* stage, uint8_t* block0, bool sync, RecordHeader* h, std::string_view key,
               const uint8_t* value) {
  const uint64_t bytes = RecordBytes(key.size(), h->value_len);
  ImageWriter w{fd, h->offset, bytes, block0};
  uint32_t crc = 0;  // a tombstone's stays 0, the crc32c of no bytes
  for (uint64_t pos = 0; pos < bytes && w.err == 0; pos += kChunkBytes) {
    uint64_t n = std::min(kChunkBytes, bytes - pos);
    FillImage(stage, pos, n, key, value, h->value_len, &crc);
    w.Put(pos, stage, n);
  }
  h->value_crc = crc;
  SealRecordHeader(h);
  int e = w.Finish(*h);
  if (e == 0 && sync && fdatasync(fd) != 0) e = errno;
  return e;
}

RecordHeader PackRecord(uint8_t* out, uint16_t kind, std::string_view key, const uint8_t* value, uint64_t len,
                        uint32_t seg, uint64_t off, uint64_t generation, uint64_t seq) {
  uint32_t crc = 0;
  FillImage(out, 0, RecordBytes(key.size(), len), key, value, len, &crc);
  RecordHeader h = NewRecordHeader(kind, key, seg, off, len, generation, seq);
  h.value_crc = crc;
  SealRecordHeader(&h);
  memcpy(out, &h, sizeof(h));
  return h;
}

}  // namespace mcxl::tier
