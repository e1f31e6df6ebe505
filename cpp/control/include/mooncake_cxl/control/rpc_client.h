// RpcClient: a client's blocking TCP connection to the master.
//
// Contract: Call sends one frame and waits for its reply, with bounded
// waits: connecting gives up after `connect_timeout_ms` (RPC_FAIL), a reply
// that does not arrive within `reply_timeout_ms` is RPC_TIMEOUT. Any I/O
// failure closes the connection; the next Call reconnects, and so does a Call
// that finds the master closed the connection since the last one (or that
// finds it closed under its request before any reply byte: an idle
// connection the master timed out; sent once more). A kError reply (the
// master rejected the frame) comes back as the status it carries.
//
// Thread safety: Call serialises callers on an internal mutex.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/rpc_protocol.h"

namespace mcxl {

class RpcClient {
 public:
  RpcClient(std::string host, int port, int connect_timeout_ms, int reply_timeout_ms)
      : host_(std::move(host)), port_(port), connect_timeout_ms_(connect_timeout_ms),
        reply_timeout_ms_(reply_timeout_ms) {}
  ~RpcClient();

  // The reply payload, or RPC_FAIL / RPC_TIMEOUT / the master's kError status.
  // `reconnected` (optional) is set when this call had to open a new
  // connection (the caller may need to re-attach).
  Result<std::string> Call(MessageType type, const std::string& payload, bool* reconnected = nullptr);
  void Disconnect();
  // Points later calls at another master (an elected one): the connection
  // closes when the address changed. False when it did not change.
  bool SetTarget(const std::string& host, int port);

 private:
  Status ConnectLocked();
  bool PeerClosed() const;
  Status SendAll(const std::string& data);
  Status RecvAll(char* p, size_t n, size_t* received = nullptr);  // *received: bytes before a failure

  std::mutex mu_;
  std::string host_;
  int port_;
  int connect_timeout_ms_, reply_timeout_ms_;
  int fd_ = -1;
  uint64_t next_id_ = 1;
  uint64_t last_unreachable_log_ns_ = 0;  // MonoNs of the last "cannot reach" line (under mu_)
};

// Splits "host:port"; false when malformed.
bool SplitHostPort(const std::string& addr, std::string* host, int* port);

}  // namespace mcxl
