#include "mooncake_cxl/control/http_request.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace mcxl {

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
      auto is_digit = [](char c) { return isdigit((unsigned char)c) != 0; };
      if (value.empty() || !std::all_of(value.begin(), value.end(), is_digit))
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

HttpHeadParse CheckPartialHttpHead(std::string_view partial) {
  // Binary junk or a TLS hello is rejected now rather than at the deadline:
  // a method is a token, so the first non-token byte before a space settles it.
  size_t start = partial.find_first_not_of("\r\n");  // leading empty lines are allowed
  if (start == std::string_view::npos) return {};
  partial.remove_prefix(start);
  std::string_view method = partial.substr(0, partial.find_first_of(" \r\n"));
  if (!IsToken(method)) return Reject(400, "malformed method");
  size_t first_nl = partial.find('\n');
  size_t line_len = first_nl == std::string_view::npos ? partial.size() : first_nl;
  if (line_len > 0 && partial[line_len - 1] == '\r') --line_len;
  if (line_len > kHttpMaxRequestLineBytes) return Reject(414, "request line too long");
  if (partial.size() > kHttpMaxHeadBytes) return Reject(431, "request head too large");
  return {};
}

}  // namespace mcxl
