// HttpServer: the master's monitoring port (--metrics_port). A small HTTP/1.1
// server for GET and HEAD only: /metrics, /health, /query_key?key= and so on.
//
// Contract: one request per connection. Every response carries Content-Length
// and "Connection: close", and the server closes the connection after it (no
// keep-alive, no pipelining: a scraper opens one connection per scrape, and
// one exchange per connection keeps the state machine small). The server
// answers bad requests itself, logs each (rate-limited) and never calls the
// handler for them:
//   400  malformed request line or header line, bad %-escape, bad Content-Length
//   405  a method other than GET or HEAD (with "Allow: GET, HEAD")
//   413  Content-Length over kHttpMaxBodyBytes
//   414  request line over kHttpMaxRequestLineBytes
//   431  request head (request line + headers) over kHttpMaxHeadBytes
//   501  Transfer-Encoding (a GET has no business sending a chunked body)
//   505  an HTTP major version other than 1
// A request body up to kHttpMaxBodyBytes is read and discarded. Each
// connection must finish its exchange (request in, response out) within
// options.request_timeout_ms of being accepted, else it is closed: a slow or
// idle client costs a connection slot, never the others' turn. Beyond
// options.max_connections, a new connection gets a 503 and is closed at once.
// Nothing a peer sends can crash the server or stop it answering others.
//
// The handler sees only well-formed GET/HEAD requests, path and query decoded.
// Unknown paths are its business (NotFound()). For HEAD the server sends the
// handler's status and headers without the body. The handler must not throw
// (an escaping exception ends the process via std::terminate) and should be
// quick: it runs on the server thread, and other connections wait for it.
//
// Thread safety: Listen, Start and Stop are called by the owner, never
// concurrently with each other. The handler runs on the server's own thread,
// so whatever it reads must be safe to read from there, and it must not call
// Stop() (Stop joins that thread). port() may be called from any thread once
// Listen has returned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "mooncake_cxl/error_code.h"

namespace mcxl {

inline constexpr size_t kHttpMaxRequestLineBytes = 8 * 1024;
inline constexpr size_t kHttpMaxHeadBytes = 16 * 1024;
inline constexpr uint64_t kHttpMaxBodyBytes = 64 * 1024;

struct HttpRequest {
  std::string method;  // "GET" or "HEAD" by the time a handler sees it
  std::string path;    // %-decoded, without the query: "/query_key"
  // Query parameters in arrival order, names and values %-decoded ('+' is a
  // space). "?a&b=" yields {"a",""}, {"b",""}.
  std::vector<std::pair<std::string, std::string>> query;

  // The first value of parameter `name`, "" when absent. *present (if given)
  // tells an absent parameter from an empty one.
  std::string Query(std::string_view name, bool* present = nullptr) const;
};

struct HttpResponse {
  int status = 200;  // 100..599; anything else is sent as 500
  std::string content_type = "text/plain; version=0.0.4; charset=utf-8";  // Prometheus text
  std::string body;
};

// Canned responses for handlers. Text ones end with a newline (curl-friendly).
HttpResponse TextResponse(int status, std::string_view text);  // text/plain
HttpResponse JsonResponse(std::string body, int status = 200);  // application/json
HttpResponse NotFound(std::string_view path);                   // 404 "no such path: ..."
HttpResponse BadRequest(std::string_view why);                  // 400 `why`
const char* HttpReasonPhrase(int status);                       // "Not Found"; "" if unknown

// %-decodes `in` into *out; '+' becomes a space when plus_is_space (query
// strings). False on a bad escape ("%4", "%zz"), *out then unspecified.
bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out);

// The outcome of parsing a request head.
struct HttpHeadParse {
  int status = 0;       // 0: a request for the handler; else the status to reject with
  std::string error;    // why, when status != 0 (for the log and the reply body)
  uint64_t content_length = 0;  // body bytes that follow the head
};

// Parses a complete request head: the request line and header lines, each
// ending in "\r\n" or "\n", without the blank line that ends the head. Fills
// req->method as soon as the request line parses (so a rejected HEAD request
// still gets no body), and the rest of *req only on success.
HttpHeadParse ParseHttpRequestHead(std::string_view head, HttpRequest* req);

struct HttpServerOptions {
  int max_connections = 256;
  int request_timeout_ms = 5000;  // from accept until the response is sent
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  explicit HttpServer(HttpServerOptions options = {}) : options_(options) {}
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds exactly `address` (a numeric IPv4 or IPv6 address) and listens;
  // port 0 picks a free port (see port()). INVALID_PARAMS for a bad address,
  // RPC_FAIL when the port cannot be bound.
  Status Listen(const std::string& address, int port);
  int port() const { return port_; }

  // Serves on a thread of its own, with its own epoll loop, until Stop().
  // REQUIRES: Listen() succeeded; Start() not called before.
  void Start(Handler handler);

  // Closes the listening socket and every open connection (requests in
  // flight get no answer) and joins the thread. Idempotent; the server cannot
  // be restarted.
  void Stop();

 private:
  HttpServerOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() makes it readable, the loop exits
  int port_ = 0;
  std::thread thread_;
};

}  // namespace mcxl
