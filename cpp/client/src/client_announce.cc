// Announcement channel holds: the master names the tenant's channel and
// counts this attachment among its holders (master_announce.cc); the
// producer and reader objects (announce.h) then work on the pool alone.
#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {

Result<Client::AnnounceChannel> Client::AnnounceOpen(std::string_view name) {
  if (closed()) return ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS;
  if (name.empty() || name.size() > kMaxChannelNameBytes) {
    MCXL_LOG(kWarn, "client", "announce channel: a name of %zu bytes (1..%u)", name.size(), kMaxChannelNameBytes);
    return ErrorCode::INVALID_PARAMS;
  }
  // Not idempotent: a resend would count a second hold.
  auto r = MasterCall(MessageType::kAnnounceOpen, [&] {
    AnnounceOpenRequest req;
    req.client = Ref();
    req.name = std::string(name);
    Encoder e;
    Encode(req, &e);
    return e.data();
  }, false);
  if (!r.ok()) return r.error();
  Decoder d(*r);
  AnnounceOpenReply reply;
  if (!Decode(&d, &reply)) return ErrorCode::RPC_FAIL;
  if (reply.status != ErrorCode::OK) return reply.status;
  if (reply.channel >= pool_->geometry().announce_channels) return ErrorCode::RPC_FAIL;
  return AnnounceChannel{reply.channel, reply.name_hash};
}

void Client::AnnounceClose(const AnnounceChannel& ch) {
  if (closed()) return;  // the detach ended every hold
  (void)MasterCall(MessageType::kAnnounceClose, [&] {
    AnnounceCloseRequest req;
    req.client = Ref();
    req.channel = ch.channel;
    req.name_hash = ch.name_hash;
    Encoder e;
    Encode(req, &e);
    return e.data();
  }, false);
}

}  // namespace mcxl
