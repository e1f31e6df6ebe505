// What a client of a non-coherent pool hands to the master instead of
// writing shared lines itself (docs/architecture.md §7). Without coherence
// across hosts an index entry line must have one writer (the master) and a
// CAS is atomic only among one host's cores, so:
//   * publishing a put is the master's CAS (kPublish, the remote clients'
//     message): the client writes its value and writes it back
//     (PublishRange, per chunk), then asks; one round trip more per put
//     batch than on a coherent pool;
//   * a read's lease goes into a private queue that a background thread
//     sends as kLeases (batched: every read queued while one request is in
//     flight goes with the next); holds and releases are sent at once, and
//     this client's removes flush the queue first, so its own reads' leases
//     are in force when they are judged. Another host's remove may run
//     before a lease queued a moment ago has landed: a lease is eviction
//     advice, never what makes a read correct (the entry re-check is);
//   * reads stay one-sided: ObserveRange of the entry, the value and the
//     entry again (ObjectIndex::ReadEntry, CopyLocked, StillValid).
// On a coherent pool nothing here runs: the client CASes the entry itself.
//
// Atomics: none of its own; lease_mu_ guards the queue, lease_send_mu_
// orders the sends.
#include <algorithm>

#include "mooncake_cxl/client/client.h"
#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"
#include "mooncake_cxl/pool/publish.h"
#include "client_internal.h"

namespace mcxl {

void Client::RaiseLease(const EntrySnapshot& s, uint64_t until_ns) {
  if (!NonCoherent()) {
    index_->ExtendLease(s.slot, until_ns);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    LeaseItem& it = pending_leases_[s.slot];
    // A newer object in the slot replaces the older one's request.
    if (it.state_gen != s.state_gen || it.until_ns < until_ns) it = {s.slot, s.state_gen, until_ns, false};
    if (lease_thread_.joinable() || lease_stop_) {
      lease_cv_.notify_one();
      return;
    }
    lease_thread_ = std::thread([this] { LeaseLoop(); });
  }
}

std::vector<int32_t> Client::SendLeases(const std::vector<LeaseItem>& items) {
  std::vector<int32_t> out(items.size(), ToInt(ErrorCode::RPC_FAIL));
  // Idempotent: a max, or a lower to a fixed deadline. A chunk's failure is
  // its items' result; the next chunk is still sent.
  (void)MasterCallInChunks<LeasesRequest, PublishReply>(
      MessageType::kLeases, items, kMaxMasterFoldItems, true,
      [&](size_t begin, size_t end, const Status& st, const PublishReply& reply) {
        bool ok = st.ok() && reply.results.size() == end - begin;
        for (size_t i = begin; i < end; ++i)
          out[i] = ok ? reply.results[i - begin] : ToInt(st.ok() ? ErrorCode::RPC_FAIL : st.error());
        return Status(ErrorCode::OK);
      });
  return out;
}

Status Client::CheckMasterFoldsLeases() {
  LeasesRequest req;
  req.client = Ref();
  Encoder e;
  Encode(req, &e);
  auto r = rpc_->Call(MessageType::kLeases, e.data());
  if (!r) return r.error();
  PublishReply reply;
  Decoder d(*r);
  if (Decode(&d, &reply) && reply.status == ErrorCode::OK && reply.results.empty()) return ErrorCode::OK;
  MCXL_LOG(kError, "client", "the master of non-coherent pool %s does not take leases (kLeases): it predates the "
           "non-coherent discipline; run a master of this version", pool_->path().c_str());
  return ErrorCode::INVALID_VERSION;
}

void Client::FlushLeases() {
  if (!NonCoherent()) return;  // a coherent pool's leases are in the entries already
  // Held across the send: a flush before a remove waits for the lease
  // thread's request in flight, so both land before the remove.
  std::lock_guard<std::mutex> sending(lease_send_mu_);
  std::vector<LeaseItem> items;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    for (const auto& [slot, it] : pending_leases_) items.push_back(it);
    pending_leases_.clear();
  }
  if (!items.empty()) (void)SendLeases(items);  // a lost lease is a hint lost
}

void Client::LeaseLoop() {
  std::unique_lock<std::mutex> lock(lease_mu_);
  while (!lease_stop_) {
    lease_cv_.wait(lock, [this] { return lease_stop_ || !pending_leases_.empty(); });
    if (lease_stop_) break;
    lock.unlock();
    FlushLeases();
    lock.lock();
  }
}

void Client::StopLeaseThread() {
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    lease_stop_ = true;
  }
  lease_cv_.notify_all();
  if (lease_thread_.joinable()) lease_thread_.join();
}

ErrorCode Client::PublishByMaster(const std::vector<std::pair<uint64_t, uint64_t>>& items,
                                  std::vector<ErrorCode>* results) {
  results->assign(items.size(), ErrorCode::TRANSFER_FAIL);
  // Not idempotent on a new attachment: the master's pending puts name
  // the attachment that started them, so a retry is refused per item.
  Status s = MasterCallInChunks<PublishRequest, PublishReply>(
      MessageType::kPublish, items, kMaxMasterFoldItems, false,
      [&](size_t begin, size_t end, const Status& st, const PublishReply& reply) {
        if (!st.ok()) return st;
        if (reply.results.size() != end - begin) return Status(ErrorCode::RPC_FAIL);
        for (size_t i = begin; i < end; ++i)
          (*results)[i] = reply.results[i - begin] == 0 ? ErrorCode::OK : ErrorCode::TRANSFER_FAIL;
        // An upsert's older values were settled by the master; a record of
        // theirs on disk is tombstoned durably before the put returns.
        return WaitTombstones(reply.tomb_ticket);
      });
  return s.ok() ? ErrorCode::OK : s.error();
}

}  // namespace mcxl
