// HttpServer: the master's monitoring port (--metrics_port). A small HTTP/1.1
// server for GET and HEAD only: /metrics, /health, /query_key?key= and so on.
//
// Contract: one request per connection. Every response carries Content-Length
// and "Connection: close", and the server closes the connection after it (no
// keep-alive, no pipelining: a scraper opens one connection per scrape, and
// one exchange per connection keeps the state machine small). A request that
// ParseHttpRequestHead or CheckPartialHttpHead rejects (http_request.h: 400,
// 405 with "Allow: GET, HEAD", 413, 414, 431, 501, 505) is answered by the
// server itself and logged (rate-limited); the handler never sees it.
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

#include <functional>
#include <string>
#include <thread>

#include "mooncake_cxl/common/error_code.h"
#include "mooncake_cxl/control/http_request.h"

namespace mcxl {

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
  int epoll_fd_ = -1;  // the loop's, created by Listen
  int port_ = 0;
  std::thread thread_;
};

}  // namespace mcxl
