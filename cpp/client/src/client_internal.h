// Helpers shared by the client's parts (client*.cc); not a public header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/error_code.h"

namespace mcxl {

// A put copies its value in chunks of this size and checks between chunks
// that the put is still its own (client_write.cc): the most a writer resumed
// after its put was revoked can still write is the rest of one chunk.
// 1 MiB: the check (two loads) costs nothing measurable at this size (put of
// 16 MiB: ~1.2 ms either way, within run-to-run noise).
constexpr uint64_t kPutChunkBytes = 1ull << 20;

template <class Request, class Reply, class Items, class Take>
Status Client::MasterCallInChunks(MessageType type, const Items& items, size_t chunk, bool idempotent,
                                  Take&& take) {
  for (size_t begin = 0; begin < items.size(); begin += chunk) {
    size_t end = std::min(items.size(), begin + chunk);
    Request req;
    req.items.assign(items.begin() + begin, items.begin() + end);
    auto r = MasterCall(type, [&] {
      req.client = Ref();  // again on a retry: a re-attach names a new attachment
      Encoder e;
      Encode(req, &e);
      return e.data();
    }, idempotent);
    Reply reply;
    Status st = ErrorCode::OK;
    if (!r.ok()) {
      st = r.error();
    } else {
      Decoder d(*r);
      st = !Decode(&d, &reply) ? Status(ErrorCode::RPC_FAIL) : Status(reply.status);
    }
    Status t = take(begin, end, st, reply);
    if (!t.ok()) return t;
  }
  return ErrorCode::OK;
}

// The status at the front of a reply payload (RPC_FAIL when unreadable).
ErrorCode StatusOfReply(const std::string& reply);
// Faults in the pages of caller memory ahead of the first copy into it.
// Best effort: older kernels lack MADV_POPULATE_WRITE and skip it.
void PrefaultForWrite(void* p, uint64_t n);
// Sum of the slices' sizes.
uint64_t TotalSize(const MutSlice* s, size_t n);
// Copies the first len bytes of src into the slices, in order (the slices
// must hold at least len bytes together).
void ScatterTo(const char* src, uint64_t len, const MutSlice* dsts, size_t ndsts);
// Copies a value of len bytes at src to where `dest` says (ReadDest).
void CopyOut(const char* src, uint64_t len, const ReadDest& dest);

}  // namespace mcxl
