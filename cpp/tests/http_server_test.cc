// HttpServer over real sockets on 127.0.0.1: GET with query decoding, HEAD,
// 405, 400s for garbage, 414/431/413 for oversized input, bodies discarded,
// an idle client not blocking others, the connection limit, many sequential
// requests, Stop() with connections open, and random bytes never stopping
// the server. Sockets carry 10 s timeouts as hang guards only; no test
// asserts on timing. (Parsing rules alone: http_request_test.cc.)
#include "mooncake_cxl/control/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace mcxl {
namespace {

// Connects to 127.0.0.1:port; -1 on failure. 10 s timeouts guard against hangs.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends what it can (the server may answer and stop reading early).
void SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(size_t(n));
  }
}

// Reads until EOF or a reset; a receive timeout is a hang and fails the test.
std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.append(buf, size_t(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ADD_FAILURE() << "server did not close";
    return out;
  }
}

// One exchange on a fresh connection: the raw response.
std::string Exchange(int port, std::string_view request, bool half_close = false) {
  int fd = Connect(port);
  if (fd < 0) {
    ADD_FAILURE() << "connect failed";
    return {};
  }
  SendAll(fd, request);
  if (half_close) shutdown(fd, SHUT_WR);
  std::string out = ReadAll(fd);
  close(fd);
  return out;
}

int StatusOf(const std::string& response) {
  if (response.compare(0, 9, "HTTP/1.1 ") != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

std::string BodyOf(const std::string& response) {
  size_t end = response.find("\r\n\r\n");
  return end == std::string::npos ? "" : response.substr(end + 4);
}

bool HasHeader(const std::string& response, const std::string& line) {
  size_t end = response.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  return response.substr(0, end + 2).find("\r\n" + line + "\r\n") != std::string::npos;
}

// Echoes the request; "/missing" is a 404, "/big" an 8 MiB body, "/bad" an
// invalid status.
HttpResponse Echo(const HttpRequest& r) {
  if (r.path == "/missing") return NotFound(r.path);
  if (r.path == "/big") {
    HttpResponse big;
    big.body.assign(8 << 20, 'x');
    return big;
  }
  if (r.path == "/bad") {
    HttpResponse bad;
    bad.status = 42;
    return bad;
  }
  std::string body = r.method + " [" + r.path + "]\n";
  for (const auto& [k, v] : r.query) body += "[" + k + "]=[" + v + "]\n";
  return TextResponse(200, body);
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(HttpServerOptions options = {}) {
    server_ = std::make_unique<HttpServer>(options);
    ASSERT_TRUE(server_->Listen("127.0.0.1", 0).ok());
    ASSERT_GT(server_->port(), 0);
    server_->Start([this](const HttpRequest& r) {
      calls_.fetch_add(1, std::memory_order_relaxed);
      return Echo(r);
    });
  }
  void SetUp() override { StartServer(); }
  std::string Get(std::string_view target) {
    return Exchange(server_->port(), "GET " + std::string(target) + " HTTP/1.1\r\nHost: t\r\n\r\n");
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> calls_{0};
};

TEST_F(HttpServerTest, GetDecodesPathAndQuery) {
  std::string r = Get("/query%5Fkey?key=a%2Fb+c&empty=&flag&x=%E2%9C%93");
  ASSERT_EQ(StatusOf(r), 200) << r;
  std::string body = BodyOf(r);
  EXPECT_EQ(body, "GET [/query_key]\n[key]=[a/b c]\n[empty]=[]\n[flag]=[]\n[x]=[\xe2\x9c\x93]\n\n");
  EXPECT_TRUE(HasHeader(r, "Content-Length: " + std::to_string(body.size())));
  EXPECT_TRUE(HasHeader(r, "Connection: close"));
  EXPECT_TRUE(HasHeader(r, "Content-Type: text/plain; charset=utf-8"));
}

TEST_F(HttpServerTest, DefaultContentTypeIsPrometheusText) {
  HttpServer s;
  ASSERT_TRUE(s.Listen("127.0.0.1", 0).ok());
  s.Start([](const HttpRequest&) {
    HttpResponse r;
    r.body = "master_key_count 3\n";
    return r;
  });
  std::string r = Exchange(s.port(), "GET /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(StatusOf(r), 200);
  EXPECT_TRUE(HasHeader(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_EQ(BodyOf(r), "master_key_count 3\n");
}

TEST_F(HttpServerTest, HeadSendsHeadersWithoutBody) {
  std::string head = Exchange(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  ASSERT_EQ(StatusOf(head), 200) << head;
  EXPECT_EQ(BodyOf(head), "");
  size_t handler_body_len = std::string("HEAD [/metrics]\n\n").size();
  EXPECT_TRUE(HasHeader(head, "Content-Length: " + std::to_string(handler_body_len))) << head;
  EXPECT_EQ(calls_.load(), 1);
}

TEST_F(HttpServerTest, HandlerStatusesPassThrough) {
  std::string r = Get("/missing");
  EXPECT_EQ(StatusOf(r), 404);
  EXPECT_EQ(BodyOf(r), "no such path: /missing\n");
  EXPECT_EQ(StatusOf(Get("/bad")), 500);  // status 42 is not sendable
}

TEST_F(HttpServerTest, OtherMethodsGet405WithAllow) {
  for (const char* req : {"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
                          "DELETE /x HTTP/1.1\r\n\r\n", "OPTIONS * HTTP/1.1\r\n\r\n"}) {
    std::string r = Exchange(server_->port(), req);
    EXPECT_EQ(StatusOf(r), 405) << req << r;
    EXPECT_TRUE(HasHeader(r, "Allow: GET, HEAD")) << r;
  }
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(HttpServerTest, GarbageGets400AndServerGoesOn) {
  using namespace std::string_literals;
  for (const std::string& req : {"hello\r\n\r\n"s, "GET /\r\n\r\n"s, "GET / HTTP/1.1\r\nBad Header\r\n\r\n"s,
                                 "GET /%zz HTTP/1.1\r\n\r\n"s, "GET /?key=%4 HTTP/1.1\r\n\r\n"s}) {
    EXPECT_EQ(StatusOf(Exchange(server_->port(), req)), 400) << req;
  }
  // A TLS ClientHello (no line end ever comes) is rejected at once, not at
  // the deadline: its first byte cannot start a method.
  EXPECT_EQ(StatusOf(Exchange(server_->port(), "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"s)), 400);
  EXPECT_EQ(StatusOf(Exchange(server_->port(), "GET / HTTP/3.0\r\n\r\n")), 505);
  std::string chunked = "GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
  EXPECT_EQ(StatusOf(Exchange(server_->port(), chunked)), 501);
  EXPECT_EQ(calls_.load(), 0);
  EXPECT_EQ(StatusOf(Get("/health")), 200);
}

TEST_F(HttpServerTest, LenientFraming) {
  // Empty lines before the request line, bare LF line ends, HTTP/1.0, no Host.
  std::string r = Exchange(server_->port(), "\r\n\nGET /a?b=c HTTP/1.0\nX: y\n\n");
  ASSERT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "GET [/a]\n[b]=[c]\n\n");
  // A client that half-closes right after its request still gets the answer.
  EXPECT_EQ(StatusOf(Exchange(server_->port(), "GET /x HTTP/1.1\r\n\r\n", true)), 200);
  // The head arriving one byte at a time.
  int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  for (char ch : std::string("GET /drip HTTP/1.1\r\nHost: t\r\n\r\n")) SendAll(fd, std::string_view(&ch, 1));
  std::string dripped = ReadAll(fd);
  close(fd);
  EXPECT_EQ(StatusOf(dripped), 200);
  EXPECT_EQ(BodyOf(dripped), "GET [/drip]\n\n");
}

TEST_F(HttpServerTest, HugeRequestLineGets414) {
  std::string uri = "/" + std::string(kHttpMaxRequestLineBytes + 100, 'a');
  EXPECT_EQ(StatusOf(Get(uri)), 414);
  // Without a line end at all: rejected as soon as the limit is passed.
  EXPECT_EQ(StatusOf(Exchange(server_->port(), "GET " + uri)), 414);
  EXPECT_EQ(StatusOf(Get("/after")), 200);
}

TEST_F(HttpServerTest, HugeHeadGets431) {
  std::string req = "GET / HTTP/1.1\r\n";
  while (req.size() < kHttpMaxHeadBytes + 1000) req += "X-Filler: " + std::string(100, 'f') + "\r\n";
  EXPECT_EQ(StatusOf(Exchange(server_->port(), req + "\r\n")), 431);
  EXPECT_EQ(StatusOf(Exchange(server_->port(), req)), 431);  // head never ends
  // Megabytes of header lines: rejected early, the rest drained.
  std::string endless = "GET / HTTP/1.1\r\n";
  while (endless.size() < (4 << 20)) endless += "X: " + std::string(1000, 'y') + "\r\n";
  EXPECT_EQ(StatusOf(Exchange(server_->port(), endless)), 431);
  EXPECT_EQ(calls_.load(), 0);
}

TEST_F(HttpServerTest, BodiesAreDiscardedOrRejected) {
  std::string r = Exchange(server_->port(), "GET /b HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789");
  ASSERT_EQ(StatusOf(r), 200) << r;
  EXPECT_EQ(BodyOf(r), "GET [/b]\n\n");
  // A body as large as allowed, sent after the head in a second write.
  int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "GET /b2 HTTP/1.1\r\nContent-Length: " + std::to_string(kHttpMaxBodyBytes) + "\r\n\r\n");
  SendAll(fd, std::string(kHttpMaxBodyBytes, 'z'));
  r = ReadAll(fd);
  close(fd);
  EXPECT_EQ(StatusOf(r), 200);
  EXPECT_EQ(BodyOf(r), "GET [/b2]\n\n");
  r = Exchange(server_->port(), "GET / HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n" + std::string(100000, 'z'));
  EXPECT_EQ(StatusOf(r), 413) << r;
}

TEST_F(HttpServerTest, LargeResponseArrivesWhole) {
  std::string r = Get("/big");
  ASSERT_EQ(StatusOf(r), 200);
  EXPECT_EQ(BodyOf(r).size(), size_t(8 << 20));
  EXPECT_TRUE(HasHeader(r, "Content-Length: " + std::to_string(8 << 20)));
}

TEST_F(HttpServerTest, ManySequentialRequests) {
  for (int i = 0; i < 500; ++i) {
    std::string r = Get("/n?i=" + std::to_string(i));
    ASSERT_EQ(StatusOf(r), 200) << i;
    ASSERT_EQ(BodyOf(r), "GET [/n]\n[i]=[" + std::to_string(i) + "]\n\n");
  }
  EXPECT_EQ(calls_.load(), 500);
}

TEST_F(HttpServerTest, IdleAndSlowClientsDoNotBlockOthers) {
  server_.reset();
  HttpServerOptions options;
  options.request_timeout_ms = 300;
  StartServer(options);
  int idle = Connect(server_->port());
  int slow = Connect(server_->port());
  ASSERT_GE(idle, 0);
  ASSERT_GE(slow, 0);
  SendAll(slow, "GET /slow HT");
  EXPECT_EQ(StatusOf(Get("/other")), 200);
  // Both are closed at their deadline without an answer.
  EXPECT_EQ(ReadAll(idle), "");
  EXPECT_EQ(ReadAll(slow), "");
  close(idle);
  close(slow);
  EXPECT_EQ(calls_.load(), 1);
}

TEST_F(HttpServerTest, ConnectionsBeyondTheLimitAreTurnedAway) {
  server_.reset();
  HttpServerOptions options;
  options.max_connections = 2;
  StartServer(options);
  int a = Connect(server_->port()), b = Connect(server_->port());
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  // Accepted in order, so the third is over the limit.
  std::string r = Get("/third");
  EXPECT_TRUE(r.empty() || StatusOf(r) == 503) << r;
  close(a);
  // Once the server has noticed the close, a slot is free again.
  bool served = false;
  for (int i = 0; i < 2000 && !served; ++i) {
    served = StatusOf(Get("/later")) == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(served);
  close(b);
}

TEST_F(HttpServerTest, StopClosesOpenConnections) {
  std::vector<int> fds;
  for (int i = 0; i < 5; ++i) fds.push_back(Connect(server_->port()));
  SendAll(fds[0], "GET /partial HTTP/1.1\r\n");
  EXPECT_EQ(StatusOf(Get("/x")), 200);  // the loop is running and has accepted them
  int port = server_->port();
  server_->Stop();
  server_->Stop();  // idempotent
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    EXPECT_EQ(ReadAll(fd), "");
    close(fd);
  }
  EXPECT_EQ(Connect(port), -1);  // the port is released
}

TEST_F(HttpServerTest, RandomBytesNeverStopTheServer) {
  std::mt19937 rng(12345);
  auto rand_below = [&](size_t n) { return size_t(rng() % n); };
  const std::string valid = "GET /fuzz?key=a%20b&x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc";
  const char* pieces[] = {"GET", "HEAD", "POST", " ", "/", "?", "&", "=", "%", "%4", "%41", "+", "HTTP/1.1",
                          "HTTP/9.9", "\r\n", "\n", "\r", ":", "Content-Length", "Transfer-Encoding",
                          "999999999",
                          "\x00", "\xff", "\t"};
  for (int iter = 0; iter < 400; ++iter) {
    std::string req;
    switch (iter % 3) {
      case 0:  // random bytes, sometimes longer than any limit
        req.resize(rand_below(iter % 30 == 0 ? 40000 : 2000));
        for (char& ch : req) ch = char(rng());
        break;
      case 1:  // a valid request with a few bytes flipped, inserted or dropped
        req = valid;
        for (size_t k = 1 + rand_below(4); k > 0 && !req.empty(); --k) {
          size_t at = rand_below(req.size());
          switch (rand_below(3)) {
            case 0: req[at] = char(rng()); break;
            case 1: req.insert(at, 1, char(rng())); break;
            default: req.erase(at, 1);
          }
        }
        break;
      default:  // shuffled protocol tokens
        for (size_t k = 5 + rand_below(40); k > 0; --k) req += pieces[rand_below(std::size(pieces))];
        req += "\r\n\r\n";
    }
    std::string r = Exchange(server_->port(), req, /*half_close=*/true);
    if (!r.empty()) {
      int status = StatusOf(r);
      ASSERT_TRUE(status >= 200 && status <= 599) << "iteration " << iter << ": " << r.substr(0, 80);
    }
  }
  std::string r = Get("/still?alive=yes");
  ASSERT_EQ(StatusOf(r), 200);
  EXPECT_EQ(BodyOf(r), "GET [/still]\n[alive]=[yes]\n\n");
}

TEST(HttpServerListenTest, BadAddressAndBusyPort) {
  HttpServer a;
  EXPECT_EQ(a.Listen("localhost", 0).error(), ErrorCode::INVALID_PARAMS);  // numeric only: no DNS
  EXPECT_EQ(a.Listen("127.0.0.1", 70000).error(), ErrorCode::INVALID_PARAMS);
  ASSERT_TRUE(a.Listen("127.0.0.1", 0).ok());
  HttpServer b;
  EXPECT_EQ(b.Listen("127.0.0.1", a.port()).error(), ErrorCode::RPC_FAIL);
  b.Start([](const HttpRequest&) { return HttpResponse{}; });  // logged, not started
  b.Stop();
}

TEST(HttpServerListenTest, DestructorStopsAServingServer) {
  int port = 0;
  {
    HttpServer s;
    ASSERT_TRUE(s.Listen("127.0.0.1", 0).ok());
    port = s.port();
    s.Start([](const HttpRequest& r) { return TextResponse(200, "ok"); });
    EXPECT_EQ(StatusOf(Exchange(port, "GET / HTTP/1.1\r\n\r\n")), 200);
  }
  EXPECT_EQ(Connect(port), -1);
}

}  // namespace
}  // namespace mcxl
