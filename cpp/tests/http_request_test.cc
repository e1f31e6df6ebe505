// Request parsing without sockets: percent-decoding, query parameters,
// request heads accepted and rejected (with the status for each), the early
// checks on a head still arriving, and the canned responses.
#include "mooncake_cxl/control/http_request.h"

#include <gtest/gtest.h>

#include <string>

namespace mcxl {
namespace {

TEST(PercentDecodeTest, DecodesEscapesAndPlus) {
  std::string out;
  ASSERT_TRUE(PercentDecode("a%2Fb+c%e2%9C%93", true, &out));
  EXPECT_EQ(out, "a/b c\xe2\x9c\x93");
  ASSERT_TRUE(PercentDecode("a+b", false, &out));
  EXPECT_EQ(out, "a+b");
  ASSERT_TRUE(PercentDecode("%00x", true, &out));
  EXPECT_EQ(out, std::string("\0x", 2));
  ASSERT_TRUE(PercentDecode("", true, &out));
  EXPECT_EQ(out, "");
}

TEST(PercentDecodeTest, RejectsBadEscapes) {
  std::string out;
  for (const char* bad : {"%", "%4", "a%zz", "%g0", "abc%", "%%"})
    EXPECT_FALSE(PercentDecode(bad, true, &out)) << bad;
}

TEST(ParseHeadTest, QueryAbsentEmptyAndRepeated) {
  HttpRequest req;
  HttpHeadParse p = ParseHttpRequestHead("GET /q?key=&a=1&a=2&flag&&b=x+y HTTP/1.1\r\nHost: h\r\n", &req);
  ASSERT_EQ(p.status, 0) << p.error;
  bool present = false;
  EXPECT_EQ(req.Query("key", &present), "");
  EXPECT_TRUE(present);
  EXPECT_EQ(req.Query("a"), "1");  // the first of repeated names
  EXPECT_EQ(req.Query("flag", &present), "");
  EXPECT_TRUE(present);
  EXPECT_EQ(req.Query("b"), "x y");
  EXPECT_EQ(req.Query("missing", &present), "");
  EXPECT_FALSE(present);
  EXPECT_EQ(req.query.size(), 5u);
}

TEST(ParseHeadTest, AbsoluteFormFragmentAndBareLineFeeds) {
  HttpRequest req;
  ASSERT_EQ(ParseHttpRequestHead("GET http://example:9003/health?x=1#frag HTTP/1.0\n", &req).status, 0);
  EXPECT_EQ(req.path, "/health");
  EXPECT_EQ(req.Query("x"), "1");
  ASSERT_EQ(ParseHttpRequestHead("HEAD HTTP://host HTTP/1.1\nA: b\n", &req).status, 0);
  EXPECT_EQ(req.method, "HEAD");
  EXPECT_EQ(req.path, "/");
}

TEST(ParseHeadTest, RejectionStatuses) {
  struct Case {
    const char* head;
    int status;
  } cases[] = {
      {"GET /", 400},
      {"GET  / HTTP/1.1", 400},
      {"GET / HTTP/1.1 x", 400},
      {"G(T / HTTP/1.1", 400},
      {"GET / FOO/1.1", 400},
      {"GET / HTTP/11", 400},
      {"GET / HTTP/2.0", 505},
      {"GET * HTTP/1.1", 400},
      {"GET ftp://x/ HTTP/1.1", 400},
      {"GET /a\x01 HTTP/1.1", 400},
      {"POST / HTTP/1.1", 405},
      {"DELETE /x HTTP/1.1", 405},
      {"GET /%zz HTTP/1.1", 400},
      {"GET /?a=%4 HTTP/1.1", 400},
      {"GET / HTTP/1.1\r\nNoColon\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Name: v\r\n", 400},
      {"GET / HTTP/1.1\r\n: v\r\n", 400},
      {"GET / HTTP/1.1\r\nA: b\r\n  folded\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: abc\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: -1\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n", 400},
      {"GET / HTTP/1.1\r\nContent-Length: 999999999999999999999999\r\n", 413},
      {"GET / HTTP/1.1\r\nContent-Length: 65537\r\n", 413},
      {"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", 501},
  };
  for (const Case& c : cases) {
    HttpRequest req;
    EXPECT_EQ(ParseHttpRequestHead(c.head, &req).status, c.status) << c.head;
  }
  HttpRequest req;
  EXPECT_EQ(ParseHttpRequestHead("GET / HTTP/1.1\r\nContent-Length: 65536\r\nContent-Length: 65536\r\n", &req)
                .content_length,
            65536u);
}

TEST(CheckPartialHeadTest, RejectsEarlyOnlyWhatCannotBecomeAHead) {
  for (const char* fine : {"", "\r\n", "G", "GET", "GET /metr", "GET / HTTP/1.1\r\nHost: x\r\n", "\r\nGET /"})
    EXPECT_EQ(CheckPartialHttpHead(fine).status, 0) << fine;
  EXPECT_EQ(CheckPartialHttpHead("\x16\x03\x01").status, 400);  // a TLS hello
  EXPECT_EQ(CheckPartialHttpHead(" GET /").status, 400);
  EXPECT_EQ(CheckPartialHttpHead("GE(T /").status, 400);
  std::string line = "GET /" + std::string(kHttpMaxRequestLineBytes, 'a');
  EXPECT_EQ(CheckPartialHttpHead(line).status, 414);
  EXPECT_EQ(CheckPartialHttpHead(line.substr(0, kHttpMaxRequestLineBytes)).status, 0);
  std::string head = "GET / HTTP/1.1\r\n";
  while (head.size() <= kHttpMaxHeadBytes) head += "X: y\r\n";
  EXPECT_EQ(CheckPartialHttpHead(head).status, 431);
}

TEST(CannedResponsesTest, StatusTypeAndBody) {
  HttpResponse r = NotFound("/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "no such path: /nope\n");
  EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
  r = BadRequest("missing parameter 'key'");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body, "missing parameter 'key'\n");
  r = JsonResponse("{}");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.body, "{}");
  EXPECT_EQ(HttpResponse().content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_STREQ(HttpReasonPhrase(431), "Request Header Fields Too Large");
  EXPECT_STREQ(HttpReasonPhrase(299), "");
}

}  // namespace
}  // namespace mcxl
