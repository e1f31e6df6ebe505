#include "mooncake_cxl/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <unordered_map>

#include "mooncake_cxl/clock.h"
#include "mooncake_cxl/log.h"

namespace mcxl {

// ---------------------------------------------------------------------------
// Requests and responses (pure functions)
// ---------------------------------------------------------------------------

std::string HttpRequest::Query(std::string_view name, bool* present) const {
  for (const auto& [k, v] : query) {
    if (k == name) {
      if (present != nullptr) *present = true;
      return v;
    }
  }
  if (present != nullptr) *present = false;
  return {};
}

const char* HttpReasonPhrase(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "";
  }
}

HttpResponse TextResponse(int status, std::string_view text) {
  HttpResponse r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body.assign(text);
  r.body += '\n';
  return r;
}

HttpResponse JsonResponse(std::string body, int status) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

HttpResponse NotFound(std::string_view path) {
  return TextResponse(404, "no such path: " + std::string(path));
}

HttpResponse BadRequest(std::string_view why) { return TextResponse(400, why); }

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

bool PercentDecode(std::string_view in, bool plus_is_space, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return false;  // "%" or "%4" at the end
      int hi = HexValue(in[i + 1]), lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(char(hi * 16 + lo));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out->push_back(' ');
    } else {
      out->push_back(c);
    }
  }
  return true;
}

namespace {

// RFC 9110 tchar: what a method or a header name may consist of.
bool IsTokenChar(unsigned char c) {
  if (c >= '0' && c <= '9') return true;
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
  return strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(c); });
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return (x | 0x20) == (y | 0x20); });
}

std::string_view TrimWhitespace(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The next line of `*rest` without its "\n" or "\r\n"; consumes it.
std::string_view NextLine(std::string_view* rest) {
  size_t nl = rest->find('\n');
  std::string_view line = rest->substr(0, nl);
  rest->remove_prefix(nl == std::string_view::npos ? rest->size() : nl + 1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

bool ParseQueryString(std::string_view qs, std::vector<std::pair<std::string, std::string>>* out) {
  while (!qs.empty()) {
    size_t amp = qs.find('&');
    std::string_view part = qs.substr(0, amp);
    qs.remove_prefix(amp == std::string_view::npos ? qs.size() : amp + 1);
    if (part.empty()) continue;  // "a=1&&b=2"
    size_t eq = part.find('=');
    std::string name, value;
    if (!PercentDecode(part.substr(0, eq), true, &name)) return false;
    if (eq != std::string_view::npos && !PercentDecode(part.substr(eq + 1), true, &value)) return false;
    out->emplace_back(std::move(name), std::move(value));
  }
  return true;
}

HttpHeadParse Reject(int status, std::string why) {
  HttpHeadParse p;
  p.status = status;
  p.error = std::move(why);
  return p;
}

}  // namespace

HttpHeadParse ParseHttpRequestHead(std::string_view head, HttpRequest* req) {
  std::string_view rest = head;
  std::string_view line = NextLine(&rest);
  if (line.size() > kHttpMaxRequestLineBytes) return Reject(414, "request line too long");
  if (head.size() > kHttpMaxHeadBytes) return Reject(431, "request head too large");

  // request-line = method SP request-target SP HTTP-version, single spaces.
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return Reject(400, "malformed request line");
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Reject(400, "malformed method");
  req->method.assign(method);
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !isdigit((unsigned char)version[5]) ||
      version[6] != '.' || !isdigit((unsigned char)version[7]))
    return Reject(400, "malformed HTTP version");
  if (version[5] != '1') return Reject(505, "only HTTP/1.x is served");
  if (target.empty() || std::any_of(target.begin(), target.end(),
                                    [](char c) { return (unsigned char)c <= 0x20 || c == 0x7f; }))
    return Reject(400, "malformed request target");
  if (method != "GET" && method != "HEAD") return Reject(405, "only GET and HEAD are served");

  // Headers: only the body framing matters to us; everything else is
  // checked for well-formedness and ignored. (Host is not required: being
  // lenient costs nothing on a monitoring port.)
  bool have_length = false;
  uint64_t length = 0;
  while (!rest.empty()) {
    line = NextLine(&rest);
    if (line.empty()) continue;
    if (line[0] == ' ' || line[0] == '\t') return Reject(400, "obsolete header line folding");
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon)))
      return Reject(400, "malformed header line");
    std::string_view name = line.substr(0, colon);
    std::string_view value = TrimWhitespace(line.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(),
                    [](char c) { return ((unsigned char)c < 0x20 && c != '\t') || c == 0x7f; }))
      return Reject(400, "control character in a header value");
    if (EqualsIgnoreCase(name, "transfer-encoding"))
      return Reject(501, "Transfer-Encoding is not supported");
    if (EqualsIgnoreCase(name, "content-length")) {
      if (value.empty() || !std::all_of(value.begin(), value.end(), [](char c) { return isdigit((unsigned char)c); }))
        return Reject(400, "malformed Content-Length");
      // Compare as digits first: a 30-digit length must not overflow.
      uint64_t v = value.size() > 18 ? ~0ull : std::stoull(std::string(value));
      if (have_length && v != length) return Reject(400, "conflicting Content-Length headers");
      have_length = true;
      length = v;
    }
  }
  if (length > kHttpMaxBodyBytes) return Reject(413, "request body too large");

  // origin-form "/path?query", or absolute-form "http://host/path?query"
  // (which RFC 9112 says servers must accept).
  if (target[0] != '/') {
    size_t scheme_end = target.find("://");
    if (scheme_end == std::string_view::npos ||
        !(EqualsIgnoreCase(target.substr(0, scheme_end), "http") ||
          EqualsIgnoreCase(target.substr(0, scheme_end), "https")))
      return Reject(400, "malformed request target");
    size_t path_start = target.find('/', scheme_end + 3);
    target = path_start == std::string_view::npos ? std::string_view("/") : target.substr(path_start);
  }
  target = target.substr(0, target.find('#'));
  size_t qmark = target.find('?');
  std::string path;
  if (!PercentDecode(target.substr(0, qmark), false, &path)) return Reject(400, "bad %-escape in the path");
  std::vector<std::pair<std::string, std::string>> query;
  if (qmark != std::string_view::npos && !ParseQueryString(target.substr(qmark + 1), &query))
    return Reject(400, "bad %-escape in the query");

  req->path = std::move(path);
  req->query = std::move(query);
  HttpHeadParse ok;
  ok.content_length = length;
  return ok;
}

// ---------------------------------------------------------------------------
// The server loop
// ---------------------------------------------------------------------------

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
  HttpLoop(int listen_fd, int wake_fd, const HttpServerOptions& options, const HttpServer::Handler& handler)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), options_(options), handler_(handler) {}
  ~HttpLoop() {
    for (auto& [fd, c] : conns_) close(fd);
    if (epoll_fd_ >= 0) close(epoll_fd_);
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
  // Reads what is available; false on EOF or a socket error (sets peer_closed).
  bool ReadInto(int fd, Conn& c, std::string* sink, size_t limit);
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

  int listen_fd_, wake_fd_, epoll_fd_ = -1;
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
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    MCXL_LOG(kError, "http", "epoll_create1: %s; not serving", strerror(errno));
    return;
  }
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
      if (!ReadInto(fd, c, &c.in, kReadChunk)) {
        ParseHead(fd, c);  // a client may half-close right after its request
        if (c.phase == Phase::kHead) c.done = true;
        return;
      }
      ParseHead(fd, c);
      return;
    case Phase::kBody: {
      std::string discard;
      bool open = ReadInto(fd, c, &discard, kReadChunk);
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

bool HttpLoop::ReadInto(int fd, Conn& c, std::string* sink, size_t limit) {
  char buf[kReadChunk];
  // Read at most one chunk per event: ParseHead must look at the bytes
  // before a garbage-spewing peer makes `in` grow.
  size_t want = std::min(limit, sizeof(buf));
  for (;;) {
    ssize_t n = recv(fd, buf, want, 0);
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
    // Reject what cannot become a request line now (a TLS hello, binary
    // junk) rather than at the deadline: the method must be a token.
    size_t method_end = c.in.find_first_of(" \r\n");
    std::string_view method = std::string_view(c.in).substr(0, method_end);
    size_t first_nl = c.in.find('\n');
    if (!std::all_of(method.begin(), method.end(), [](char ch) { return IsTokenChar(ch); })) {
      RejectRequest(fd, c, 400, "malformed method");
    } else if (first_nl == std::string::npos ? c.in.size() > kHttpMaxRequestLineBytes
                                             : first_nl > kHttpMaxRequestLineBytes + 1) {
      RejectRequest(fd, c, 414, "request line too long");
    } else if (c.in.size() > kHttpMaxHeadBytes) {
      RejectRequest(fd, c, 431, "request head too large");
    }
    return;  // wait for more (or the deadline)
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
      LogRejection("%s: request not complete within %d ms; closed", c.peer.c_str(), options_.request_timeout_ms);
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
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    MCXL_LOG(kError, "http", "eventfd: %s", strerror(errno));
    close(fd);
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
    HttpLoop loop(listen_fd_, wake_fd_, options_, h);
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
  listen_fd_ = wake_fd_ = -1;
}

}  // namespace mcxl
