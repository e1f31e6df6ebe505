// EtcdClient: the few etcd v3 calls high availability needs, over etcd's
// JSON gateway (HTTP/1.1 POST to /v3/...; libcurl for the transport,
// nlohmann-json for the bodies; keys and values travel base64-encoded).
//
// Contract: every call is blocking and bounded by `timeout_ms`; it tries the
// endpoints in turn, starting from the last one that answered, and returns
// RPC_FAIL when none answered (a reply etcd sent with an error, or one that
// does not parse, is RPC_FAIL too, with one log line). Nothing here elects:
// etcd decides, through a lease and a create-if-absent transaction.
//
// Thread safety: calls may come from any thread (each opens its own curl
// handle; the endpoint cursor is atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mooncake_cxl/common/error_code.h"

namespace mcxl {

struct EtcdKeyValue {
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class EtcdClient {
 public:
  // Endpoints "host:port" (an "http://" prefix is accepted).
  EtcdClient(std::vector<std::string> endpoints, int timeout_ms);

  // "etcd://h1:2379;h2:2379" or "h1:2379,h2:2379": the endpoints; empty
  // entries dropped.
  static std::vector<std::string> SplitEndpoints(std::string_view list);

  // A lease of `ttl_s` seconds: its id.
  Result<int64_t> LeaseGrant(int64_t ttl_s);
  // One keep-alive: the lease's remaining TTL in seconds, 0 when etcd no
  // longer knows the lease (it expired).
  Result<int64_t> LeaseKeepAlive(int64_t lease);
  Status LeaseRevoke(int64_t lease);
  // Writes key = value attached to `lease` only if the key does not exist:
  // the etcd revision of the write, or 0 when the key exists.
  Result<int64_t> CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease);
  // Rewrites key = value (attached to `lease`) only while the key is the one
  // created at `create_revision`: the revision of the write, or 0.
  Result<int64_t> ReplaceIfCreatedAt(std::string_view key, std::string_view value, int64_t lease,
                                     int64_t create_revision);
  // The key, or nullopt when it does not exist.
  Result<std::optional<EtcdKeyValue>> Get(std::string_view key);

  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  // POSTs `body` to `path` of an endpoint; the reply body.
  Result<std::string> Post(const char* path, const std::string& body);
  // A put of key = value with `lease` if the key's create revision is `create_revision`.
  Result<int64_t> PutIfCreateRevision(std::string_view key, std::string_view value, int64_t lease,
                                      int64_t create_revision);

  std::vector<std::string> endpoints_;
  int timeout_ms_;
  // Relaxed: a hint of which endpoint to try first; any value is valid.
  std::atomic<size_t> next_{0};
};

}  // namespace mcxl
