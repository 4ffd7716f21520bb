#pragma once
// The HTTP/1.1 response parser of the etcd client (etcd.md says why it is
// our own): an incremental state machine fed with bytes as they arrive,
// bounded in what it buffers, with a clear error for any input outside the
// subset etcd's JSON gateway (Go's net/http) speaks.
#include <coio/core/result.hpp>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace storage::http1 {

/// What the parser rejects, each with its own message.
enum class HttpErrc {
  malformedStatusLine = 1,  ///< not `HTTP/1.x NNN reason`
  malformedHeader,          ///< a header line without a name and colon, or a folded one
  headTooLarge,             ///< status line and headers longer than Limits::maxHeadBytes
  bodyTooLarge,             ///< a Content-Length or chunk beyond Limits::maxBodyBytes
  badContentLength,         ///< not a decimal number, or two that disagree
  badChunk,                 ///< a chunk size line or chunk end that is not HTTP's
  unsupported,              ///< a 1xx, a transfer coding other than chunked, or no length at all
  truncated,                ///< the connection ended inside the response
};

}  // namespace storage::http1

/// @cond INTERNAL
template <>
struct std::is_error_code_enum<storage::http1::HttpErrc> : std::true_type {};
/// @endcond

namespace storage::http1 {

namespace detail {
class HttpCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "http1"; }
  std::string message(int ev) const override {
    switch (static_cast<HttpErrc>(ev)) {
      case HttpErrc::malformedStatusLine: return "malformed HTTP status line";
      case HttpErrc::malformedHeader: return "malformed HTTP header line";
      case HttpErrc::headTooLarge: return "HTTP response head too large";
      case HttpErrc::bodyTooLarge: return "HTTP response body too large";
      case HttpErrc::badContentLength: return "invalid HTTP Content-Length";
      case HttpErrc::badChunk: return "malformed HTTP chunk";
      case HttpErrc::unsupported: return "HTTP response outside the supported subset";
      case HttpErrc::truncated: return "HTTP response truncated (connection ended inside it)";
    }
    return "unknown HTTP error";
  }
};

inline bool equalsIgnoringCase(std::string_view a, std::string_view b) noexcept {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    return lower(x) == lower(y);
  });
}

inline std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a comma-separated header value lists `token` (e.g. Connection: close).
inline bool listsToken(std::string_view value, std::string_view token) noexcept {
  while (!value.empty()) {
    const std::size_t comma = value.find(',');
    if (equalsIgnoringCase(trim(value.substr(0, comma)), token)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}
}  // namespace detail

/// The error category of HttpErrc ("http1").
inline const std::error_category& httpCategory() noexcept {
  static const detail::HttpCategory category;
  return category;
}

/// Makes HttpErrc usable as a std::error_code (found by ADL).
inline std::error_code make_error_code(HttpErrc e) noexcept {  // NOLINT: name fixed by the standard
  return {static_cast<int>(e), httpCategory()};
}

/// What one response may hold.
struct Limits {
  std::size_t maxHeadBytes = 16 * 1024;  ///< status line and headers (also a chunked body's trailers)
  /// The body in all (ResponseParser counts what it delivers); a streamed
  /// body's reader sets it to the maximum and bounds each message itself.
  std::size_t maxBodyBytes = 16u << 20;
};

/// Parses one HTTP/1.1 response, incrementally: feed() it the bytes as they
/// come, in pieces of any size; it hands the body's bytes (de-chunked) to
/// the caller and buffers only a partial line (bounded by maxHeadBytes).
///
/// The subset: `HTTP/1.1` or `HTTP/1.0`, status 200-599 (a 1xx is
/// rejected: the client never asks for one), CRLF line ends, a body with a
/// Content-Length or `Transfer-Encoding: chunked` (a 204 or 304 needs
/// neither), `Connection: close` honoured.
/// Guarantees: any byte string yields a clear HttpErrc or a response, never
/// undefined behaviour nor unbounded memory; after an error, feed() keeps
/// returning it. Single-threaded, no I/O.
class ResponseParser {
 public:
  explicit ResponseParser(Limits limits = {}) noexcept : limits_(limits) {}

  /// Consumes bytes of `in`, appending body bytes to `body`; stops at the
  /// end of the response (whatever follows is not consumed). The count of
  /// bytes consumed, or the error in the input.
  coio::Result<std::size_t> feed(std::string_view in, std::string& body) {
    if (error_) return error_;
    std::size_t used = 0;
    while (used < in.size() && state_ != State::done) {
      const std::string_view rest = in.substr(used);
      if (state_ == State::body || state_ == State::chunkData) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(remaining_, rest.size()));
        body.append(rest.substr(0, n));
        remaining_ -= n;
        used += n;
        if (remaining_ == 0) state_ = state_ == State::body ? State::done : State::chunkEnd;
        continue;
      }
      // A line: status, header, chunk size, chunk end or trailer.
      const std::size_t lf = rest.find('\n');
      const std::size_t take = lf == std::string_view::npos ? rest.size() : lf + 1;
      if (line_.size() + take > lineLimit()) return fail(overlongLine());
      line_.append(rest.substr(0, take));
      used += take;
      if (lf == std::string_view::npos) break;
      if (line_.size() < 2 || line_[line_.size() - 2] != '\r') return fail(malformedLine());
      const std::string_view line = std::string_view(line_).substr(0, line_.size() - 2);
      // Chunk lines are bounded one by one; the head's and the trailers' add up.
      if (state_ != State::chunkSize && state_ != State::chunkEnd) headBytes_ += line_.size();
      if (coio::Result<void> ok = onLine(line); !ok) return fail(ok.error());
      line_.clear();
    }
    return used;
  }

  /// The connection ended after the bytes fed so far: an error unless the
  /// response was complete.
  coio::Result<void> finish() {
    if (error_) return error_;
    if (state_ != State::done) return fail(HttpErrc::truncated);
    return {};
  }

  /// Whether the status line and headers are in (status() is known).
  bool headComplete() const noexcept { return state_ > State::headers; }
  /// Whether the whole response is in.
  bool complete() const noexcept { return state_ == State::done; }
  /// The status code, once headComplete().
  int status() const noexcept { return status_; }
  /// Whether the connection may carry another request once complete().
  bool keepAlive() const noexcept { return keepAlive_; }

 private:
  enum class State { statusLine, headers, body, chunkSize, chunkData, chunkEnd, trailers, done };

  std::size_t lineLimit() const noexcept {
    // A chunk size line is short; the head's lines share one budget.
    if (state_ == State::chunkSize || state_ == State::chunkEnd) return 1024;
    return limits_.maxHeadBytes - std::min(headBytes_, limits_.maxHeadBytes);
  }
  HttpErrc overlongLine() const noexcept {
    return state_ == State::chunkSize || state_ == State::chunkEnd ? HttpErrc::badChunk : HttpErrc::headTooLarge;
  }
  HttpErrc malformedLine() const noexcept {
    switch (state_) {
      case State::statusLine: return HttpErrc::malformedStatusLine;
      case State::chunkSize:
      case State::chunkEnd: return HttpErrc::badChunk;
      default: return HttpErrc::malformedHeader;
    }
  }
  std::error_code fail(std::error_code e) noexcept {
    error_ = e;
    return error_;
  }

  coio::Result<void> onLine(std::string_view line) {
    switch (state_) {
      case State::statusLine: return onStatusLine(line);
      case State::headers: return line.empty() ? onHeadEnd() : onHeader(line);
      case State::chunkSize: return onChunkSize(line);
      case State::chunkEnd:
        if (!line.empty()) return HttpErrc::badChunk;
        state_ = State::chunkSize;
        return {};
      case State::trailers:
        if (line.empty()) state_ = State::done;
        return {};
      default: return {};  // not reached: body bytes are no lines
    }
  }

  coio::Result<void> onStatusLine(std::string_view line) {
    // "HTTP/1.1 200 OK": version, one space, three digits, then a space or the end.
    if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
        (line.size() > 12 && line[12] != ' ')) {
      return HttpErrc::malformedStatusLine;
    }
    int status = 0;
    const auto [end, ec] = std::from_chars(line.data() + 9, line.data() + 12, status);
    if (ec != std::errc{} || end != line.data() + 12 || status < 100) return HttpErrc::malformedStatusLine;
    if (status < 200) return HttpErrc::unsupported;
    status_ = status;
    keepAlive_ = line[7] == '1';
    state_ = State::headers;
    return {};
  }

  coio::Result<void> onHeader(std::string_view line) {
    if (line.front() == ' ' || line.front() == '\t') return HttpErrc::malformedHeader;  // obsolete folding
    const std::size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return HttpErrc::malformedHeader;
    const std::string_view name = line.substr(0, colon);
    if (name.find_first_of(" \t") != std::string_view::npos) return HttpErrc::malformedHeader;
    const std::string_view value = detail::trim(line.substr(colon + 1));
    if (detail::equalsIgnoringCase(name, "content-length")) {
      std::uint64_t length = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), length);
      if (value.empty() || ec != std::errc{} || end != value.data() + value.size()) {
        return ec == std::errc::result_out_of_range ? HttpErrc::bodyTooLarge : HttpErrc::badContentLength;
      }
      if (contentLength_ && *contentLength_ != length) return HttpErrc::badContentLength;
      contentLength_ = length;
    } else if (detail::equalsIgnoringCase(name, "transfer-encoding")) {
      if (!detail::equalsIgnoringCase(value, "chunked")) return HttpErrc::unsupported;
      chunked_ = true;
    } else if (detail::equalsIgnoringCase(name, "connection")) {
      if (detail::listsToken(value, "close")) keepAlive_ = false;
    }
    return {};
  }

  coio::Result<void> onHeadEnd() {
    if (chunked_) {
      // RFC 9112 6.3: chunked wins over a Content-Length, which then must not be trusted.
      if (contentLength_) return HttpErrc::badContentLength;
      state_ = State::chunkSize;
      headBytes_ = 0;  // trailers get a budget of their own
      return {};
    }
    if (status_ == 204 || status_ == 304) {
      state_ = State::done;
      return {};
    }
    if (!contentLength_) return HttpErrc::unsupported;  // a body up to the close: not in the subset
    if (*contentLength_ > limits_.maxBodyBytes) return HttpErrc::bodyTooLarge;
    remaining_ = *contentLength_;
    state_ = remaining_ == 0 ? State::done : State::body;
    return {};
  }

  coio::Result<void> onChunkSize(std::string_view line) {
    const std::string_view size = detail::trim(line.substr(0, line.find(';')));  // extensions ignored
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), n, 16);
    if (size.empty() || end != size.data() + size.size()) return HttpErrc::badChunk;
    if (ec != std::errc{} || n > limits_.maxBodyBytes - std::min(bodyBytes_, limits_.maxBodyBytes)) {
      return HttpErrc::bodyTooLarge;
    }
    bodyBytes_ += n;
    remaining_ = n;
    state_ = n == 0 ? State::trailers : State::chunkData;
    return {};
  }

  Limits limits_;
  State state_ = State::statusLine;
  std::string line_;            // the line being read, up to its LF
  std::size_t headBytes_ = 0;   // head (or trailer) bytes so far
  std::uint64_t bodyBytes_ = 0; // chunked: announced so far
  std::uint64_t remaining_ = 0; // of the body or the current chunk
  std::optional<std::uint64_t> contentLength_;
  bool chunked_ = false;
  int status_ = 0;
  bool keepAlive_ = true;
  std::error_code error_;
};

}  // namespace storage::http1
