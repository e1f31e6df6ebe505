// TcpServer (tcp_server.h) over real sockets on 127.0.0.1, serving a
// FakeService, its loop on a thread of this process: framing (two frames in
// one write, a frame split over many writes), a bad header (magic, version,
// a payload over kMaxPayloadBytes) answered with kError and the connection
// closed, a connection beyond max_connections closed at once, a sliced
// request run on the worker with the connection's replies kept in request
// order, a worker's reply to a peer that left dropped (and a peer closing
// during a sliced request let go after it), a peer that does not
// read paused and then dropped, one that reads late served in full, and the
// idle timeout. Bounds are asserted, never times: a deadline only keeps a
// failing test from hanging.
#include "mooncake_cxl/control/tcp_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mooncake_cxl/common/log.h"
#include "test_util/deadline.h"
#include "test_util/fake_service.h"
#include "test_util/wire.h"

namespace mcxl {
namespace {

using testutil::FakeService;
using testutil::Frame;
using testutil::kGuard;
using testutil::StatusOf;

// A peer of the server: a blocking socket whose reads give up after the
// guard (SO_RCVTIMEO), so that a reply that never comes fails the test.
class Peer {
 public:
  // rcvbuf: the socket's receive buffer (0 = the kernel's default).
  explicit Peer(int port, int rcvbuf = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (rcvbuf > 0) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    timeval tv{std::chrono::duration_cast<std::chrono::seconds>(kGuard).count(), 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  }
  ~Peer() { Close(); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  // Closes with a reset (RST) instead of an orderly end of stream.
  void Reset() {
    linger l{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    Close();
  }
  int fd() const { return fd_; }
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += size_t(n);
    }
    return true;
  }
  // The next frame; false on end of stream, an error or the guard.
  bool ReadFrame(Frame* f) {
    if (!RecvAll(&f->header, sizeof(f->header))) return false;
    if (f->header.payload_bytes > kMaxPayloadBytes) return false;
    f->payload.resize(f->header.payload_bytes);
    return RecvAll(f->payload.data(), f->payload.size());
  }
  // A round trip of one frame: its reply.
  Frame Call(MessageType type, uint64_t id, const std::string& payload) {
    Frame f;
    EXPECT_TRUE(Send(MakeFrame(type, id, payload)));
    EXPECT_TRUE(ReadFrame(&f)) << "no reply to request " << id;
    return f;
  }
  // Binds the connection to `slot` in the FakeService (its disconnect is then reported).
  void Attach(uint32_t slot) {
    std::string p(4, '\0');
    memcpy(p.data(), &slot, 4);
    EXPECT_EQ(Call(MessageType::kAttach, 0, p).payload, p);
  }
  // True when the server closed the connection (end of stream or a reset),
  // reading and dropping what came before; false when the guard passed.
  bool Closed(size_t* bytes_before = nullptr) {
    char buf[65536];
    size_t got = 0;
    for (;;) {
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) {
        got += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (bytes_before != nullptr) *bytes_before = got;
      return n == 0 || errno == ECONNRESET;
    }
  }

 private:
  bool RecvAll(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = recv(fd_, c, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      c += r;
      n -= size_t(r);
    }
    return true;
  }
  int fd_ = -1;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(i * 2654435761u >> 13);
  return s;
}

// The largest a TCP send queue can grow to on this machine (tcp_wmem's max).
uint64_t MaxSendBuffer() {
  uint64_t lo = 0, def = 0, max = 4 << 20;
  if (FILE* f = fopen("/proc/sys/net/ipv4/tcp_wmem", "r")) {
    if (fscanf(f, "%lu %lu %lu", &lo, &def, &max) != 3) max = 4 << 20;
    fclose(f);
  }
  return max;
}

class TcpServerTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogLevel(LogLevel::kError); }
  void TearDown() override {
    service_.Release();  // a worker inside a sliced request finishes, so the server can go
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    server_.reset();
    SetLogLevel(LogLevel::kInfo);
  }
  void Start(const TcpServerOptions& options = {}) {
    server_ = std::make_unique<TcpServer>(&service_, options);
    ASSERT_TRUE(server_->Listen("127.0.0.1", 0).ok());
    ASSERT_GT(server_->port(), 0);
    thread_ = std::thread([this] { server_->Run(stop_); });
  }
  int port() const { return server_->port(); }

  FakeService service_;
  std::unique_ptr<TcpServer> server_;
  std::atomic<bool> stop_{false};  // the server loop polls it; seq_cst stores and loads (the default)
  std::thread thread_;
};

TEST_F(TcpServerTest, TwoFramesInOneWriteGetTwoRepliesInOrder) {
  Start();
  Peer p(port());
  ASSERT_TRUE(p.Send(MakeFrame(MessageType::kPing, 1, "first") + MakeFrame(MessageType::kPing, 2, "second")));
  Frame a, b;
  ASSERT_TRUE(p.ReadFrame(&a));
  ASSERT_TRUE(p.ReadFrame(&b));
  EXPECT_EQ(a.header.request_id, 1u);
  EXPECT_EQ(a.payload, "first");
  EXPECT_EQ(b.header.request_id, 2u);
  EXPECT_EQ(b.payload, "second");
  EXPECT_EQ(a.header.magic, kFrameMagic);
  EXPECT_EQ(a.header.version, kProtocolVersion);
  EXPECT_EQ(a.header.type, uint16_t(MessageType::kPing));
}

TEST_F(TcpServerTest, FramesSplitOverManyWritesAreReassembled) {
  Start();
  Peer p(port());
  // Two frames, the first larger than the server's read chunk, cut at
  // sizes that put cuts inside headers and payloads alike.
  const std::string big = Pattern(300 * 1024), small = "tail";
  const std::string bytes = MakeFrame(MessageType::kPing, 1, big) + MakeFrame(MessageType::kPing, 2, small);
  const size_t cuts[] = {1, 3, 7, 13, 24, 4096, 65535, 100000};
  size_t pos = 0;
  for (size_t i = 0; pos < bytes.size(); ++i) {
    size_t n = std::min(cuts[i % 8], bytes.size() - pos);
    ASSERT_TRUE(p.Send(bytes.substr(pos, n)));
    pos += n;
  }
  Frame a, b;
  ASSERT_TRUE(p.ReadFrame(&a));
  ASSERT_TRUE(p.ReadFrame(&b));
  EXPECT_EQ(a.header.request_id, 1u);
  EXPECT_TRUE(a.payload == big);
  EXPECT_EQ(b.header.request_id, 2u);
  EXPECT_EQ(b.payload, small);
  EXPECT_EQ(service_.handled(), 2);
}

TEST_F(TcpServerTest, BadHeaderGetsAnErrorReplyAndTheConnectionIsClosed) {
  Start();
  struct Case {
    const char* what;
    uint32_t magic;
    uint16_t version;
    uint32_t payload_bytes;
  };
  const Case cases[] = {
      {"bad magic", kFrameMagic ^ 1, kProtocolVersion, 4},
      {"bad version", kFrameMagic, uint16_t(kProtocolVersion + 1), 4},
      {"payload over kMaxPayloadBytes", kFrameMagic, kProtocolVersion, kMaxPayloadBytes + 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Peer p(port());
    FrameHeader h{c.magic, c.version, uint16_t(MessageType::kPing), c.payload_bytes, 0, 42};
    std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
    if (c.payload_bytes == 4) bytes += "abcd";
    ASSERT_TRUE(p.Send(bytes));
    Frame f;
    ASSERT_TRUE(p.ReadFrame(&f));
    EXPECT_EQ(f.header.type, uint16_t(MessageType::kError));
    EXPECT_EQ(f.header.request_id, 42u);
    EXPECT_EQ(StatusOf(f.payload), ErrorCode::INVALID_PARAMS);
    EXPECT_TRUE(p.Closed());
  }
  EXPECT_EQ(service_.handled(), 0);
  // The server itself is unharmed.
  Peer ok(port());
  EXPECT_EQ(ok.Call(MessageType::kPing, 1, "still here").payload, "still here");
}

TEST_F(TcpServerTest, ConnectionBeyondMaxConnectionsIsClosedAtOnce) {
  TcpServerOptions o;
  o.max_connections = 2;
  Start(o);
  auto a = std::make_unique<Peer>(port());
  Peer b(port());
  a->Attach(1);  // both accepted and served
  b.Attach(2);
  Peer refused(port());
  EXPECT_TRUE(refused.Closed());
  // One leaves: once the server has let it go, there is room for one more.
  a.reset();
  ASSERT_TRUE(service_.WaitDisconnect(1));
  Peer next(port());
  EXPECT_EQ(next.Call(MessageType::kPing, 2, "room again").payload, "room again");
  EXPECT_EQ(b.Call(MessageType::kPing, 3, "b still served").payload, "b still served");
}

TEST_F(TcpServerTest, SlicedRequestRunsOnTheWorkerAndRepliesStayInOrder) {
  Start();
  Peer a(port()), b(port());
  ASSERT_TRUE(a.Send(MakeFrame(MessageType::kRemoveAll, 1, "scan") + MakeFrame(MessageType::kPing, 2, "after scan")));
  ASSERT_TRUE(service_.WaitSlicedStarted(1));
  // While the scan runs, other connections are served ...
  EXPECT_EQ(b.Call(MessageType::kPing, 9, "other").payload, "other");
  // ... but nothing more of a's: its next request waits behind the scan.
  EXPECT_EQ(service_.calls("after scan"), 0);
  EXPECT_NE(service_.sliced_thread(), service_.plain_thread());
  service_.Release();
  Frame f1, f2;
  ASSERT_TRUE(a.ReadFrame(&f1));
  ASSERT_TRUE(a.ReadFrame(&f2));
  EXPECT_EQ(f1.header.request_id, 1u);
  EXPECT_EQ(f1.header.type, uint16_t(MessageType::kRemoveAll));
  EXPECT_EQ(f1.payload, "scan");
  EXPECT_EQ(f2.header.request_id, 2u);
  EXPECT_EQ(f2.payload, "after scan");
}

TEST_F(TcpServerTest, WorkersReplyToAPeerThatLeftIsDropped) {
  Start();
  auto gone = std::make_unique<Peer>(port());
  gone->Attach(5);
  ASSERT_TRUE(gone->Send(MakeFrame(MessageType::kRemoveAll, 77, "gone's scan")));
  ASSERT_TRUE(service_.WaitSlicedStarted(1));
  gone->Reset();  // a reset is seen at once, also on a connection not read from
  gone.reset();
  ASSERT_TRUE(service_.WaitDisconnect(5));
  // A new connection (likely on the same fd) queues its own scan behind
  // the first: the worker answers both in order, and only its own reply
  // may reach it.
  Peer next(port());
  ASSERT_TRUE(next.Send(MakeFrame(MessageType::kRemoveAll, 88, "next's scan")));
  service_.Release();
  Frame f;
  ASSERT_TRUE(next.ReadFrame(&f));
  EXPECT_EQ(f.header.request_id, 88u);
  EXPECT_EQ(f.payload, "next's scan");
}

// A connection is not read from while its sliced request runs: a peer that
// closes meanwhile is let go once the reply is queued.
TEST_F(TcpServerTest, PeerThatClosesDuringASlicedRequestIsLetGoAfterIt) {
  Start();
  auto gone = std::make_unique<Peer>(port());
  gone->Attach(6);
  ASSERT_TRUE(gone->Send(MakeFrame(MessageType::kRemoveAll, 1, "scan")));
  ASSERT_TRUE(service_.WaitSlicedStarted(1));
  gone.reset();
  service_.Release();
  EXPECT_TRUE(service_.WaitDisconnect(6));
  Peer next(port());
  EXPECT_EQ(next.Call(MessageType::kPing, 2, "served").payload, "served");
}

// A peer that sends requests and reads none of the replies: the server
// answers only while what it holds for the peer stays bounded, then stops
// reading it, and drops it once no reply byte has gone out for
// stall_drop_ms.
TEST_F(TcpServerTest, PeerThatDoesNotReadIsPausedThenDropped) {
  TcpServerOptions o;
  o.out_pause_bytes = 64 * 1024;
  o.stall_drop_ms = 200;
  o.idle_timeout_s = 0;
  Start(o);
  constexpr size_t kReply = 64 * 1024;
  constexpr int kRequests = 2000;  // 128 MiB of replies asked for
  service_.set_reply_bytes(kReply);
  Peer p(port(), 4096);
  p.Attach(9);
  std::string requests;
  for (int i = 0; i < kRequests; ++i) requests += MakeFrame(MessageType::kPutStart, 100 + i, "p");
  ASSERT_TRUE(p.Send(requests));
  ASSERT_TRUE(service_.WaitDisconnect(9)) << "the stalled peer was never dropped";
  // What was answered fits the pause threshold, one reply over it, and the
  // kernel's buffers between the server and the peer.
  int rcvbuf = 0;
  socklen_t len = sizeof(rcvbuf);
  ASSERT_EQ(getsockopt(p.fd(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len), 0);
  const uint64_t bound = o.out_pause_bytes + 2 * (kReply + sizeof(FrameHeader)) + MaxSendBuffer() +
                         uint64_t(rcvbuf) + 64 * 1024;
  const int answered = service_.calls("p");
  EXPECT_GT(answered, 0);
  EXPECT_LE(uint64_t(answered) * (kReply + sizeof(FrameHeader)), bound) << answered << " replies";
  EXPECT_LT(answered, kRequests);
  size_t got = 0;
  EXPECT_TRUE(p.Closed(&got));
  EXPECT_LE(got, uint64_t(answered) * (kReply + sizeof(FrameHeader)));
}

// The same flood from a peer that reads: the server pauses and resumes as
// the peer drains its replies, and every reply arrives, in request order.
TEST_F(TcpServerTest, PeerThatReadsLateGetsEveryReplyInOrder) {
  TcpServerOptions o;
  o.out_pause_bytes = 64 * 1024;
  o.stall_drop_ms = 600 * 1000;
  Start(o);
  constexpr size_t kReply = 64 * 1024;
  constexpr int kRequests = 300;  // ~19 MiB: several times what the buffers hold
  service_.set_reply_bytes(kReply);
  Peer p(port(), 4096);
  std::string requests;
  for (int i = 0; i < kRequests; ++i) requests += MakeFrame(MessageType::kPutStart, 100 + i, "p");
  ASSERT_TRUE(p.Send(requests));
  for (int i = 0; i < kRequests; ++i) {
    Frame f;
    ASSERT_TRUE(p.ReadFrame(&f)) << "reply " << i << " of " << kRequests << " never came";
    EXPECT_EQ(f.header.request_id, uint64_t(100 + i));
    EXPECT_EQ(f.payload.size(), kReply);
  }
  EXPECT_EQ(service_.calls("p"), kRequests);
}

TEST_F(TcpServerTest, IdleConnectionIsClosedAfterTheTimeout) {
  TcpServerOptions o;
  o.idle_timeout_s = 1;
  Start(o);
  Peer p(port());
  p.Attach(4);
  size_t got = 1;
  EXPECT_TRUE(p.Closed(&got));  // end of stream, no reply bytes before it
  EXPECT_EQ(got, 0u);
  EXPECT_TRUE(service_.WaitDisconnect(4));
  Peer next(port());  // a new connection is served as usual
  EXPECT_EQ(next.Call(MessageType::kPing, 1, "hello").payload, "hello");
}

}  // namespace
}  // namespace mcxl
