// libFuzzer target for what the etcd client reads from the network: an
// HTTP/1.1 response through ResponseParser, then its body as etcd's JSON,
// decoded as every reply type (and, split at newlines, as watch stream
// messages). The first byte picks the piece size the parser is fed in; the
// rest is the response. Nothing may crash, read out of bounds or exceed
// the limits, and the parser's outcome must not depend on how the bytes
// were split.
#include "etcd/etcd_messages.hpp"
#include "etcd/http1.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <system_error>

using namespace storage::etcd;
using storage::http1::Limits;
using storage::http1::ResponseParser;

namespace {

constexpr Limits kLimits{1024, 4096};

struct Outcome {
  std::error_code error;
  std::string body;
  std::size_t used = 0;
  bool complete = false;
  int status = 0;
  bool keepAlive = false;
};

Outcome parse(std::string_view bytes, std::size_t step) {
  ResponseParser parser(kLimits);
  Outcome out;
  while (out.used < bytes.size() && !parser.complete()) {
    coio::Result<std::size_t> n = parser.feed(bytes.substr(out.used, step), out.body);
    if (!n) {
      out.error = n.error();
      return out;
    }
    if (*n == 0) std::abort();  // no progress on a non-empty piece, before the end
    out.used += *n;
  }
  if (out.body.size() > kLimits.maxBodyBytes) std::abort();
  out.complete = parser.complete();
  if (out.complete) {
    out.status = parser.status();
    out.keepAlive = parser.keepAlive();
  } else if (coio::Result<void> end = parser.finish(); !end) {
    out.error = end.error();
  }
  return out;
}

template <typename T>
void decodeAs(const Json& json) {
  std::string why;
  coio::Result<T> value = decode<T>(json, why);
  if (!value && why.empty()) std::abort();  // a refusal always says why
}

void decodeBody(std::string_view body) {
  std::string why;
  coio::Result<Json> json = parseJson(body, why);
  if (!json) return;
  (void)decodeFailure(*json);
  decodeAs<RangeResponse>(*json);
  decodeAs<PutResponse>(*json);
  decodeAs<DeleteResponse>(*json);
  decodeAs<TxnResponse>(*json);
  decodeAs<Lease>(*json);
  decodeAs<LeaseStatus>(*json);
  decodeAs<ResponseHeader>(*json);
  if (json->is_object()) {
    if (const auto result = json->find("result"); result != json->end()) decodeAs<WatchMessage>(*result);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t step = 1 + data[0] % 64;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  const Outcome whole = parse(bytes, bytes.size() + 1);
  const Outcome pieces = parse(bytes, step);
  if (whole.error != pieces.error || whole.body != pieces.body || whole.complete != pieces.complete ||
      whole.status != pieces.status || whole.keepAlive != pieces.keepAlive ||
      (whole.complete && whole.used != pieces.used)) {
    std::abort();
  }
  if (!whole.complete) return 0;
  decodeBody(whole.body);
  for (std::size_t begin = 0; begin < whole.body.size();) {  // a watch stream's messages
    const std::size_t end = std::min(whole.body.find('\n', begin), whole.body.size());
    decodeBody(std::string_view(whole.body).substr(begin, end - begin));
    begin = end + 1;
  }
  return 0;
}
