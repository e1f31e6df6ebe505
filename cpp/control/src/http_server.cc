#include "mooncake_cxl/control/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "mooncake_cxl/common/clock.h"
#include "mooncake_cxl/common/log.h"

namespace mcxl {
namespace {

constexpr size_t kReadChunk = 16 * 1024;
// After the response, the server half-closes and reads until the client
// closes, for at most this long: closing a socket with unread input sends a
// RST, which can destroy the response before the client reads it.
constexpr uint64_t kLingerNs = 1'000'000'000;
constexpr uint64_t kAcceptPauseNs = 100'000'000;  // after EMFILE and friends
constexpr int kLogLinesPerSecond = 10;

// Limits log lines about rejected peers: a fuzzer or a broken scraper must
// not flood the master's log. Lines past the budget are counted and the
// count is reported with the next line that gets through.
class LogBudget {
 public:
  // True if a line may be logged now; *suppressed gets the lines dropped
  // since the last one logged.
  bool Take(uint64_t* suppressed) {
    uint64_t now = MonoNs();
    if (now - window_start_ns_ >= 1'000'000'000) {
      window_start_ns_ = now;
      used_ = 0;
    }
    if (used_ >= kLogLinesPerSecond) {
      ++suppressed_;
      return false;
    }
    ++used_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

 private:
  uint64_t window_start_ns_ = 0;
  int used_ = 0;
  uint64_t suppressed_ = 0;
};

std::string PeerName(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

std::string SerializeResponse(const HttpResponse& r, bool head_only, bool allow_header) {
  int status = r.status;
  if (status < 100 || status > 599) {
    MCXL_LOG(kError, "http", "handler returned status %d; sending 500", status);
    return SerializeResponse(TextResponse(500, "handler returned an invalid status"), head_only, false);
  }
  std::string out;
  out.reserve(160 + (head_only ? 0 : r.body.size()));
  out += "HTTP/1.1 " + std::to_string(status) + " " + HttpReasonPhrase(status) + "\r\n";
  out += "Content-Type: " + r.content_type + "\r\n";
  out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
  out += "Connection: close\r\n";
  if (allow_header) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head_only) out += r.body;
  return out;
}

// One epoll loop: owns the connections; borrows the listening socket and
// the wake eventfd from HttpServer. Lives on the server thread only.
class HttpLoop {
 public:
  // The three descriptors are the server's (it closes them).
  HttpLoop(int listen_fd, int wake_fd, int epoll_fd, const HttpServerOptions& options,
           const HttpServer::Handler& handler)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), epoll_fd_(epoll_fd), options_(options), handler_(handler) {}
  ~HttpLoop() {
    for (auto& [fd, c] : conns_) close(fd);
  }
  void Run();

 private:
  // kHead: reading the request head; kBody: discarding a request body;
  // kWrite: sending the response; kLinger: half-closed, draining input.
  enum class Phase { kHead, kBody, kWrite, kLinger };
  struct Conn {
    Phase phase = Phase::kHead;
    std::string in;          // unparsed request bytes (kHead only)
    size_t scan = 0;         // start of the first unterminated line in `in`
    uint64_t body_left = 0;  // request body bytes still to discard (kBody)
    std::string out;         // the response
    size_t sent = 0;
    bool peer_closed = false;  // read EOF: nothing left to drain
    bool done = false;         // to be closed once the current event is handled
    uint64_t deadline_ns = 0;
    std::string peer;
    HttpRequest req;
  };

  void Watch(int fd, uint32_t events, int op = EPOLL_CTL_MOD);
  void Accept();
  void OnEvent(int fd, Conn& c, uint32_t events);
  // Reads one chunk if available; false on EOF or a socket error (sets
  // peer_closed). One chunk per event: ParseHead must judge the bytes
  // before a garbage-spewing peer makes `in` grow.
  bool ReadInto(int fd, Conn& c, std::string* sink);
  void ParseHead(int fd, Conn& c);
  void Dispatch(int fd, Conn& c);
  void Respond(int fd, Conn& c, std::string response);
  void RejectRequest(int fd, Conn& c, int status, const std::string& why);
  void Flush(int fd, Conn& c);
  void Drain(int fd, Conn& c);
  void Close(int fd);
  void ExpireDeadlines();
  int NextTimeoutMs() const;
  void LogRejection(const char* fmt, ...) __attribute__((format(printf, 2, 3)));

  int listen_fd_, wake_fd_, epoll_fd_;
  const HttpServerOptions& options_;
  const HttpServer::Handler& handler_;
  std::unordered_map<int, Conn> conns_;
  uint64_t accept_paused_until_ns_ = 0;  // 0: accepting
  LogBudget log_budget_;
};

void HttpLoop::LogRejection(const char* fmt, ...) {
  if (!LogEnabled(LogLevel::kWarn)) return;
  uint64_t suppressed = 0;
  if (!log_budget_.Take(&suppressed)) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (suppressed > 0)
    MCXL_LOG(kWarn, "http", "%s (%llu similar lines suppressed)", line, (unsigned long long)suppressed);
  else
    MCXL_LOG(kWarn, "http", "%s", line);
}

void HttpLoop::Watch(int fd, uint32_t events, int op) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, op, fd, &ev);
}

void HttpLoop::Run() {
  Watch(listen_fd_, EPOLLIN, EPOLL_CTL_ADD);
  Watch(wake_fd_, EPOLLIN, EPOLL_CTL_ADD);
  epoll_event events[64];
  for (;;) {
    int n = epoll_wait(epoll_fd_, events, 64, NextTimeoutMs());
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_) return;  // Stop(); the destructor closes connections
      if (fd == listen_fd_) {
        Accept();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      OnEvent(fd, it->second, events[i].events);
      if (it->second.done) Close(fd);
    }
    ExpireDeadlines();
    if (accept_paused_until_ns_ != 0 && MonoNs() >= accept_paused_until_ns_) {
      accept_paused_until_ns_ = 0;
      Watch(listen_fd_, EPOLLIN);
    }
  }
}

void HttpLoop::Accept() {
  for (;;) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Level-triggered epoll would spin on the pending connection: stop
        // watching the listening socket for a moment instead.
        MCXL_LOG(kError, "http", "accept: %s; pausing accepts for 100 ms", strerror(errno));
        accept_paused_until_ns_ = MonoNs() + kAcceptPauseNs;
        Watch(listen_fd_, 0);
      }
      return;
    }
    if (conns_.size() >= size_t(std::max(options_.max_connections, 0))) {
      static const std::string kBusy =
          SerializeResponse(TextResponse(503, "too many connections"), false, false);
      ssize_t ignored = send(fd, kBusy.data(), kBusy.size(), MSG_NOSIGNAL);  // best effort
      (void)ignored;
      close(fd);
      LogRejection("%s: 503, over %d connections", PeerName(addr).c_str(), options_.max_connections);
      continue;
    }
    Conn& c = conns_[fd];
    c.peer = PeerName(addr);
    c.deadline_ns = MonoNs() + uint64_t(std::max(options_.request_timeout_ms, 0)) * 1'000'000;
    Watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
  }
}

void HttpLoop::OnEvent(int fd, Conn& c, uint32_t events) {
  switch (c.phase) {
    case Phase::kHead:
      if (!ReadInto(fd, c, &c.in)) {
        ParseHead(fd, c);  // a client may half-close right after its request
        if (c.phase == Phase::kHead) c.done = true;
        return;
      }
      ParseHead(fd, c);
      return;
    case Phase::kBody: {
      std::string discard;
      bool open = ReadInto(fd, c, &discard);
      c.body_left -= std::min<uint64_t>(c.body_left, discard.size());
      if (c.body_left == 0 || !open) Dispatch(fd, c);
      return;
    }
    case Phase::kWrite:
      if (events & (EPOLLERR | EPOLLHUP)) {
        c.done = true;
        return;
      }
      Flush(fd, c);
      return;
    case Phase::kLinger:
      Drain(fd, c);
      return;
  }
}

bool HttpLoop::ReadInto(int fd, Conn& c, std::string* sink) {
  char buf[kReadChunk];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      sink->append(buf, size_t(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    c.peer_closed = true;
    return false;
  }
}

void HttpLoop::ParseHead(int fd, Conn& c) {
  // Empty lines before the request line are ignored (RFC 9112 2.2).
  size_t skip = 0;
  while (skip < c.in.size() && (c.in[skip] == '\r' || c.in[skip] == '\n')) ++skip;
  if (skip > 0) {
    c.in.erase(0, skip);
    c.scan = 0;
  }
  // Find the blank line that ends the head, resuming where the last scan
  // stopped so that a client dripping bytes costs linear time.
  size_t head_end = std::string::npos, body_start = 0;
  for (;;) {
    size_t nl = c.in.find('\n', c.scan);
    if (nl == std::string::npos) break;
    size_t line_len = nl - c.scan - (nl > c.scan && c.in[nl - 1] == '\r' ? 1 : 0);
    if (line_len == 0 && c.scan > 0) {
      head_end = c.scan;
      body_start = nl + 1;
      break;
    }
    c.scan = nl + 1;
  }
  if (head_end == std::string::npos) {
    HttpHeadParse p = CheckPartialHttpHead(c.in);
    if (p.status != 0) RejectRequest(fd, c, p.status, p.error);
    return;  // else wait for more (or the deadline)
  }
  HttpHeadParse p = ParseHttpRequestHead(std::string_view(c.in).substr(0, head_end), &c.req);
  if (p.status != 0) {
    RejectRequest(fd, c, p.status, p.error);
    return;
  }
  uint64_t already = c.in.size() - body_start;  // body bytes read with the head
  c.body_left = p.content_length - std::min(p.content_length, already);
  c.in = std::string();
  if (c.body_left > 0 && !c.peer_closed) {
    c.phase = Phase::kBody;
    return;
  }
  Dispatch(fd, c);
}

void HttpLoop::Dispatch(int fd, Conn& c) {
  MCXL_LOG(kDebug, "http", "%s: %s %s", c.peer.c_str(), c.req.method.c_str(), c.req.path.c_str());
  c.req.peer_address = c.peer.substr(0, c.peer.rfind(':'));  // PeerName is "address:port"
  HttpResponse r = handler_(c.req);
  Respond(fd, c, SerializeResponse(r, c.req.method == "HEAD", false));
}

void HttpLoop::RejectRequest(int fd, Conn& c, int status, const std::string& why) {
  LogRejection("%s: %d %s: %s", c.peer.c_str(), status, HttpReasonPhrase(status), why.c_str());
  c.in = std::string();
  Respond(fd, c, SerializeResponse(TextResponse(status, why), c.req.method == "HEAD", status == 405));
}

void HttpLoop::Respond(int fd, Conn& c, std::string response) {
  c.phase = Phase::kWrite;
  c.out = std::move(response);
  c.sent = 0;
  Flush(fd, c);  // usually the whole response fits the socket buffer at once
}

void HttpLoop::Flush(int fd, Conn& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = send(fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Watch(fd, EPOLLOUT);
      return;
    }
    c.done = true;  // peer gone
    return;
  }
  if (c.peer_closed) {
    c.done = true;
    return;
  }
  shutdown(fd, SHUT_WR);  // the client sees the end of the response now
  c.phase = Phase::kLinger;
  c.out = std::string();
  c.deadline_ns = std::min(c.deadline_ns, MonoNs() + kLingerNs);
  Watch(fd, EPOLLIN | EPOLLRDHUP);
  Drain(fd, c);
}

void HttpLoop::Drain(int fd, Conn& c) {
  char buf[kReadChunk];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    c.done = true;  // EOF: the client has read the response and closed
    return;
  }
}

// Only from Run and ExpireDeadlines: everything below them marks `done`
// instead, so no Conn& is left dangling.
void HttpLoop::Close(int fd) {
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  conns_.erase(fd);
}

void HttpLoop::ExpireDeadlines() {
  uint64_t now = MonoNs();
  std::vector<int> expired;
  for (auto& [fd, c] : conns_)
    if (now >= c.deadline_ns) expired.push_back(fd);
  for (int fd : expired) {
    Conn& c = conns_[fd];
    if (c.phase == Phase::kWrite) {
      LogRejection("%s: closed after %d ms with %zu response bytes unsent", c.peer.c_str(),
                   options_.request_timeout_ms, c.out.size() - c.sent);
    } else if (c.phase != Phase::kLinger && !(c.phase == Phase::kHead && c.in.empty())) {
      LogRejection("%s: request not complete within %d ms; closed", c.peer.c_str(),
                   options_.request_timeout_ms);
    }
    Close(fd);
  }
}

int HttpLoop::NextTimeoutMs() const {
  uint64_t next = accept_paused_until_ns_ != 0 ? accept_paused_until_ns_ : ~0ull;
  for (const auto& [fd, c] : conns_) next = std::min(next, c.deadline_ns);
  if (next == ~0ull) return -1;
  uint64_t now = MonoNs();
  if (next <= now) return 0;
  return int(std::min<uint64_t>((next - now + 999'999) / 1'000'000, 60'000));  // round up: no busy spin
}

}  // namespace

// ---------------------------------------------------------------------------
// HttpServer
// ---------------------------------------------------------------------------

HttpServer::~HttpServer() { Stop(); }

Status HttpServer::Listen(const std::string& address, int port) {
  if (listen_fd_ >= 0) {
    MCXL_LOG(kError, "http", "Listen called twice");
    return ErrorCode::INVALID_PARAMS;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;  // no DNS: bind exactly what was asked
  addrinfo* ai = nullptr;
  if (port < 0 || port > 65535 ||
      getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &ai) != 0 || ai == nullptr) {
    MCXL_LOG(kError, "http", "'%s' port %d is not a numeric IP address and port", address.c_str(), port);
    return ErrorCode::INVALID_PARAMS;
  }
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 256) != 0) {
    MCXL_LOG(kError, "http", "cannot listen on %s:%d: %s", address.c_str(), port, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
    return ErrorCode::RPC_FAIL;
  }
  freeaddrinfo(ai);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // Every descriptor the loop needs is taken here, before the owner says
  // it serves: at the descriptor limit later, only new connections wait.
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_fd_ = wake_fd_ < 0 ? -1 : epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) {
    MCXL_LOG(kError, "http", "%s: %s", wake_fd_ < 0 ? "eventfd" : "epoll_create1", strerror(errno));
    if (wake_fd_ >= 0) close(wake_fd_);
    close(fd);
    wake_fd_ = epoll_fd_ = -1;
    return ErrorCode::INTERNAL_ERROR;
  }
  listen_fd_ = fd;
  return ErrorCode::OK;
}

void HttpServer::Start(Handler handler) {
  if (listen_fd_ < 0 || thread_.joinable()) {
    MCXL_LOG(kError, "http", "Start without a successful Listen, or twice; not serving");
    return;
  }
  if (!handler) handler = [](const HttpRequest& r) { return NotFound(r.path); };
  thread_ = std::thread([this, h = std::move(handler)] {
    HttpLoop loop(listen_fd_, wake_fd_, epoll_fd_, options_, h);
    loop.Run();
  });
}

void HttpServer::Stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t ignored = write(wake_fd_, &one, sizeof(one));
    (void)ignored;
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  listen_fd_ = wake_fd_ = epoll_fd_ = -1;
}

}  // namespace mcxl
