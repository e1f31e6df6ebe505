// HTTP/1.1 requests and responses as the monitoring port needs them: the
// parsing rules and their limits, decoded requests, canned responses. Pure
// functions, no I/O; HttpServer (http_server.h) does the sockets.
//
// Contract: ParseHttpRequestHead accepts exactly what HttpServer serves (GET
// and HEAD, origin- or absolute-form targets, HTTP/1.x) and names the status
// to reject anything else with: 400 malformed request line, header line,
// %-escape or Content-Length; 405 other methods; 413 Content-Length over
// kHttpMaxBodyBytes; 414 request line over kHttpMaxRequestLineBytes; 431 head
// over kHttpMaxHeadBytes; 501 Transfer-Encoding (a GET has no business
// sending a chunked body); 505 an HTTP major version other than 1. It is
// lenient where leniency costs nothing: bare LF line ends, no Host header.
//
// Thread safety: free functions on their arguments; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  // Numeric address of the peer ("127.0.0.1", "::1"), set by HttpServer.
  std::string peer_address;

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

// For a head whose blank line has not arrived yet: a rejection as soon as
// `partial` cannot become an acceptable head (a method with non-token bytes,
// a request line or head over its limit), else status 0 (keep reading).
HttpHeadParse CheckPartialHttpHead(std::string_view partial);

}  // namespace mcxl
