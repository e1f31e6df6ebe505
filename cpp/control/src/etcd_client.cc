// The etcd v3 JSON gateway as EtcdClient speaks it. etcd encodes int64s as
// JSON strings and bytes as base64, and leaves out fields at their default
// (a false `succeeded`, a zero revision), so every field is read optionally.
#include "mooncake_cxl/control/etcd_client.h"

#include <curl/curl.h>

#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "mooncake_cxl/common/log.h"

namespace mcxl {
namespace {
using nlohmann::json;

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kB64[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16 | (i + 1 < in.size() ? uint32_t(uint8_t(in[i + 1])) << 8 : 0);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

bool Unbase64(std::string_view in, std::string* out) {
  out->clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* p = strchr(kB64, c);
    if (c == '\0' || p == nullptr) return false;
    acc = acc << 6 | uint32_t(p - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      *out += char((acc >> bits) & 0xff);
    }
  }
  return true;
}

// An int64 field that etcd writes as a string (or, from some versions, a number).
int64_t Int(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_string()) return strtoll(it->get<std::string>().c_str(), nullptr, 10);
  if (it->is_number()) return it->get<int64_t>();
  return 0;
}

size_t Append(char* p, size_t size, size_t n, void* out) {
  auto* s = static_cast<std::string*>(out);
  if (s->size() + size * n > (4u << 20)) return 0;  // no reply of ours is this big: stop reading
  s->append(p, size * n);
  return size * n;
}

void InitCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

Result<json> Parse(const Result<std::string>& body, const char* what) {
  if (!body) return body.error();
  json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    MCXL_LOG(kWarn, "etcd", "%s: the reply is not a JSON object (%zu bytes)", what, body->size());
    return ErrorCode::RPC_FAIL;
  }
  if (j.contains("error") || (j.contains("code") && j.contains("message"))) {
    std::string msg = j.value("message", j.contains("error") ? j["error"].dump() : std::string());
    MCXL_LOG(kWarn, "etcd", "%s: etcd answered an error: %s", what, msg.c_str());
    return ErrorCode::RPC_FAIL;
  }
  return j;
}
}  // namespace

EtcdClient::EtcdClient(std::vector<std::string> endpoints, int timeout_ms)
    : endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {
  InitCurlOnce();
  for (auto& e : endpoints_)
    if (e.rfind("http://", 0) == 0) e = e.substr(7);
}

std::vector<std::string> EtcdClient::SplitEndpoints(std::string_view list) {
  if (list.rfind("etcd://", 0) == 0) list.remove_prefix(7);
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(";,", start);
    if (end == std::string_view::npos) end = list.size();
    std::string_view part = list.substr(start, end - start);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    if (part.rfind("http://", 0) == 0) part.remove_prefix(7);
    if (!part.empty()) out.emplace_back(part);
    start = end + 1;
  }
  return out;
}

Result<std::string> EtcdClient::Post(const char* path, const std::string& body) {
  if (endpoints_.empty()) return ErrorCode::INVALID_PARAMS;
  size_t first = next_.load(std::memory_order_relaxed) % endpoints_.size();
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    size_t i = (first + k) % endpoints_.size();
    CURL* h = curl_easy_init();
    if (h == nullptr) return ErrorCode::INTERNAL_ERROR;
    std::string url = "http://" + endpoints_[i] + path, reply;
    curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, long(body.size()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, long(timeout_ms_));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, long(timeout_ms_));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a threaded process
    curl_easy_setopt(h, CURLOPT_PROXY, "");     // never through a proxy from the environment
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, Append);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    if (rc == CURLE_OK && status == 200) {
      next_.store(i, std::memory_order_relaxed);
      return reply;
    }
    if (rc == CURLE_OK) {  // etcd answered: another endpoint would answer the same
      MCXL_LOG(kWarn, "etcd", "%s at %s: HTTP %ld: %.200s", path, endpoints_[i].c_str(), status, reply.c_str());
      return ErrorCode::RPC_FAIL;
    }
  }
  return ErrorCode::RPC_FAIL;
}

Result<int64_t> EtcdClient::LeaseGrant(int64_t ttl_s) {
  auto j = Parse(Post("/v3/lease/grant", json{{"TTL", std::to_string(ttl_s)}}.dump()), "lease grant");
  if (!j) return j.error();
  int64_t id = Int(*j, "ID");
  if (id == 0) return ErrorCode::RPC_FAIL;
  return id;
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease) {
  // A stream in gRPC; over the gateway one request body gets one result.
  auto j = Parse(Post("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()), "lease keep-alive");
  if (!j) return j.error();
  auto r = j->find("result");
  if (r == j->end() || !r->is_object()) return ErrorCode::RPC_FAIL;
  return Int(*r, "TTL");
}

Status EtcdClient::LeaseRevoke(int64_t lease) {
  auto j = Parse(Post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()), "lease revoke");
  if (!j) return j.error();
  return ErrorCode::OK;
}

Result<int64_t> EtcdClient::CreateIfAbsent(std::string_view key, std::string_view value, int64_t lease) {
  return PutIfCreateRevision(key, value, lease, 0);
}

Result<int64_t> EtcdClient::ReplaceIfCreatedAt(std::string_view key, std::string_view value, int64_t lease,
                                               int64_t create_revision) {
  if (create_revision <= 0) return ErrorCode::INVALID_PARAMS;
  return PutIfCreateRevision(key, value, lease, create_revision);
}

Result<int64_t> EtcdClient::PutIfCreateRevision(std::string_view key, std::string_view value, int64_t lease,
                                                int64_t create_revision) {
  std::string k = Base64(key);
  json txn = {
      {"compare", json::array({json{{"key", k}, {"result", "EQUAL"}, {"target", "CREATE"},
                                    {"create_revision", std::to_string(create_revision)}}})},
      {"success", json::array({json{{"request_put", json{{"key", k}, {"value", Base64(value)},
                                                        {"lease", std::to_string(lease)}}}}})},
  };
  auto j = Parse(Post("/v3/kv/txn", txn.dump()), "conditional put");
  if (!j) return j.error();
  if (!j->value("succeeded", false)) return int64_t(0);
  auto h = j->find("header");
  int64_t rev = h != j->end() && h->is_object() ? Int(*h, "revision") : 0;
  if (rev <= 0) return ErrorCode::RPC_FAIL;
  return rev;
}

Result<std::optional<EtcdKeyValue>> EtcdClient::Get(std::string_view key) {
  auto j = Parse(Post("/v3/kv/range", json{{"key", Base64(key)}}.dump()), "range");
  if (!j) return j.error();
  auto kvs = j->find("kvs");
  if (kvs == j->end() || !kvs->is_array() || kvs->empty()) return std::optional<EtcdKeyValue>{};
  const json& kv = (*kvs)[0];
  if (!kv.is_object()) return ErrorCode::RPC_FAIL;
  EtcdKeyValue out;
  if (!Unbase64(kv.value("value", std::string()), &out.value)) return ErrorCode::RPC_FAIL;
  out.create_revision = Int(kv, "create_revision");
  out.mod_revision = Int(kv, "mod_revision");
  out.lease = Int(kv, "lease");
  return std::optional<EtcdKeyValue>{std::move(out)};
}

}  // namespace mcxl
