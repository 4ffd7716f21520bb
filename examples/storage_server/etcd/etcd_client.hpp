#pragma once
// EtcdClient: etcd's v3 API (KV, transactions, leases, watches) through its
// JSON gateway, over coio's TCP; every call has a deadline, fails over
// between endpoints with backoff, and watches resume where they stopped.
// docs/etcd.md describes it. One file (about 600 lines): the client's
// calls, its failover and its Watch share the endpoint rotation and the
// connection they borrow; the wire is in etcd_messages.hpp and http1.hpp.
#include "etcd_error.hpp"
#include "etcd_messages.hpp"
#include "http_connection.hpp"

#include <coio/core/cancellation.hpp>
#include <coio/core/result.hpp>
#include <coio/core/task.hpp>
#include <coio/net/socket_address.hpp>
#include <coio/reactor/reactor.hpp>
#include <coio/reactor/with_timeout.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace storage::etcd {

// Durations and time points; the time itself is the reactor's (reactor.now()),
// virtual under a simulation, never Clock::now().
using Clock = std::chrono::steady_clock;

/// What an EtcdClient talks to and how it fails over; plain values, copied into the client.
struct EtcdOptions {
  /// etcd's client URLs, `http://IP:PORT` (IPv6 in brackets); tried in
  /// turn, starting with the first.
  std::vector<std::string> endpoints;
  /// Pause after every endpoint failed in a row, doubled each round up to backoffMax.
  Clock::duration backoffMin = std::chrono::milliseconds(20);
  Clock::duration backoffMax = std::chrono::seconds(1);
  /// Keep-alive connections kept per endpoint between calls.
  std::size_t idleConnections = 4;
  /// Bounds on one reply (a watch message is bounded by maxBodyBytes too).
  http1::Limits limits;
  /// Where failures and failovers are reported (one line each); none if empty.
  std::function<void(const std::string&)> log;
};

/// One batch of a watch: events in revision order, and the header of the
/// message that carried them.
struct WatchBatch {
  ResponseHeader header;
  std::vector<Event> events;
};

template <coio::Reactor R>
class EtcdWatch;

/// A client of an etcd cluster through its gRPC gateway (`/v3/...`, JSON
/// over HTTP/1.1).
///
/// Guarantees:
/// - Used on its reactor's loop thread only; every call is awaited there
///   and resumes there. Calls may overlap: each takes a connection of its
///   own (an idle keep-alive one, else a new one).
/// - Every call takes a timeout and returns within it (plus the time to
///   cancel a socket operation) whatever etcd does: std::errc::timed_out
///   if no endpoint answered in time, lastError() then says what the last
///   attempt met. A call also ends, with std::errc::operation_canceled,
///   when the awaiting coroutine's stop token is stopped.
/// - Failover: a connection that cannot be made or is lost moves the call
///   (and later ones) to the next endpoint at once; after every endpoint
///   failed in a row, it waits backoffMin, doubling up to backoffMax. A
///   call is retried only where that cannot apply it twice: when the
///   request did not reach etcd (the connection failed, the write failed,
///   or a reused connection was closed before any byte of the reply: the
///   server's idle close), or, for reads and keep-alives, after any
///   transport failure or an Unavailable reply. A write whose connection
///   failed after etcd may have read it yields the transport error.
/// - A member that accepts and never answers (stopped, overloaded) costs a
///   read, a keep-alive or a watch's opening one share of the call's
///   timeout (timeout / endpoints): that attempt is cancelled and the next
///   endpoint tried within the same call. Any attempt that times out, a
///   write's included (a write is not sent again: it may have been read),
///   moves later calls to the next endpoint, and a watch whose stream is on
///   that member reconnects elsewhere at its next next().
/// - Errors are values: the transport's (std::errc, coio::Errc::eof), an
///   http1::HttpErrc for a reply outside HTTP's subset, an EtcdErrc for
///   what etcd reported or a reply that is not the expected JSON. These
///   last two are not retried: they come back at once, the connection is
///   dropped and the client stays usable. The etcd message (or the reason
///   a reply was refused) is in lastError() and the log.
/// - Destroy it once no call and no EtcdWatch of it is left.
template <coio::Reactor R>
class EtcdClient {
 public:
  /// A client of `options.endpoints` (no connection yet): Errc::invalidArgument
  /// if there is none, or one is not `http://IP:PORT`.
  static coio::Result<std::unique_ptr<EtcdClient>> create(R& reactor, EtcdOptions options) {
    std::vector<Endpoint> endpoints;
    for (const std::string& url : options.endpoints) {
      std::string_view rest = url;
      if (rest.substr(0, 7) != "http://") return coio::Errc::invalidArgument;
      rest.remove_prefix(7);
      if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
      coio::Result<coio::SocketAddress> address = coio::SocketAddress::parse(rest);
      if (!address) return address.error();
      endpoints.push_back(Endpoint{std::string(rest), *address, {}});
    }
    if (endpoints.empty()) return coio::Errc::invalidArgument;
    return std::unique_ptr<EtcdClient>(new EtcdClient(reactor, std::move(options), std::move(endpoints)));
  }

  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  /// Reads a key or a range (Range).
  coio::Task<coio::Result<RangeResponse>> range(RangeRequest request, Clock::duration timeout) {
    return call<RangeResponse>("/v3/kv/range", encode(request), Kind::read, timeout);
  }
  /// Writes a key (Put).
  coio::Task<coio::Result<PutResponse>> put(PutRequest request, Clock::duration timeout) {
    return call<PutResponse>("/v3/kv/put", encode(request), Kind::write, timeout);
  }
  /// Deletes a key or a range (DeleteRange).
  coio::Task<coio::Result<DeleteResponse>> deleteRange(DeleteRequest request, Clock::duration timeout) {
    return call<DeleteResponse>("/v3/kv/deleterange", encode(request), Kind::write, timeout);
  }
  /// A transaction (Txn): `succeeded` says which branch ran.
  coio::Task<coio::Result<TxnResponse>> txn(TxnRequest request, Clock::duration timeout) {
    return call<TxnResponse>("/v3/kv/txn", encode(request), Kind::write, timeout);
  }
  /// A new lease of `ttlSeconds` (etcd's id unless `id` is given).
  coio::Task<coio::Result<Lease>> leaseGrant(std::int64_t ttlSeconds, Clock::duration timeout, std::int64_t id = 0) {
    return call<Lease>("/v3/lease/grant", encodeLeaseGrant(ttlSeconds, id), Kind::write, timeout);
  }
  /// Renews lease `id` once: its new TTL; EtcdErrc::leaseNotFound once it
  /// expired or was revoked. (One message on the gateway's keep-alive
  /// stream; keepLeaseAlive below repeats it.)
  coio::Task<coio::Result<Lease>> leaseKeepAlive(std::int64_t id, Clock::duration timeout) {
    return call<Lease>("/v3/lease/keepalive", encodeLeaseId(id), Kind::keepAlive, timeout);
  }
  /// Revokes lease `id`, deleting the keys bound to it.
  coio::Task<coio::Result<ResponseHeader>> leaseRevoke(std::int64_t id, Clock::duration timeout) {
    return call<ResponseHeader>("/v3/lease/revoke", encodeLeaseId(id), Kind::write, timeout);
  }
  /// Lease `id`'s remaining TTL (-1 once it expired).
  coio::Task<coio::Result<LeaseStatus>> leaseTimeToLive(std::int64_t id, Clock::duration timeout) {
    return call<LeaseStatus>("/v3/lease/timetolive", encodeLeaseId(id), Kind::read, timeout);
  }

  /// Starts a watch: returns once etcd has created it (so every change
  /// after that is seen, or from request.startRevision if set). Errors as
  /// for the other calls; EtcdErrc::compacted if startRevision was compacted.
  coio::Task<coio::Result<std::unique_ptr<EtcdWatch<R>>>> watch(WatchRequest request, Clock::duration timeout) {
    auto watch = std::unique_ptr<EtcdWatch<R>>(
        new EtcdWatch<R>(*this, std::move(request), attemptTimeout(Kind::read, timeout)));
    coio::Result<void> opened = co_await coio::withTimeout(reactor_, watch->open(), timeout);
    if (!opened) {
      if (watch->terminal_) lastMessage_ = watch->terminalMessage_;
      co_return failed(opened.error(), "watch", timeout);
    }
    co_return std::move(watch);
  }

  /// What the last failed attempt met (etcd's message, a refused reply's
  /// reason, or the transport error), with its endpoint.
  const std::string& lastError() const noexcept { return lastError_; }
  R& reactor() const noexcept { return reactor_; }

 private:
  friend class EtcdWatch<R>;

  struct Endpoint {
    std::string host;  // IP:PORT, the Host header
    coio::SocketAddress address;
    std::vector<http1::HttpConnection<R>> idle;
    Clock::time_point silentSince{};  // when an attempt on it last timed out (a watch there then moves)
  };

  // How a call may be retried (see the class comment).
  enum class Kind { read, write, keepAlive };

  // One attempt's end: the value, or an error and whether another endpoint may be tried.
  template <typename T>
  struct Attempt {
    coio::Result<T> result;
    bool retry = false;
  };

  // A connection from the idle pool, else a new one; `reused` says which.
  struct Connection {
    http1::HttpConnection<R> http;
    bool reused;
  };

  EtcdClient(R& reactor, EtcdOptions options, std::vector<Endpoint> endpoints)
      : reactor_(reactor), options_(std::move(options)), endpoints_(std::move(endpoints)) {}

  template <typename T>
  coio::Task<coio::Result<T>> call(std::string_view path, std::string body, Kind kind, Clock::duration timeout) {
    auto once = [this, path, &body, kind](Endpoint& endpoint) { return exchange<T>(endpoint, path, body, kind); };
    coio::Result<T> result =
        co_await coio::withTimeout(reactor_, failover<T>(once, attemptTimeout(kind, timeout), kind != Kind::write), timeout);
    if (!result) co_return failed(result.error(), path, timeout);
    co_return result;
  }

  // How long one attempt on one endpoint may take: a share of the call's
  // timeout for what may be sent again, so that a member that accepts and
  // never answers leaves time for the others; a write the whole of it.
  Clock::duration attemptTimeout(Kind kind, Clock::duration timeout) const noexcept {
    if (kind == Kind::write) return timeout;
    return timeout / static_cast<Clock::rep>(endpoints_.size());
  }

  // Runs `once(endpoint)` from the preferred endpoint on, each attempt
  // within `attemptTimeout`, moving to the next after a retryable failure
  // (a timed-out attempt is one if `resend`) and backing off after a round
  // of them, until a final outcome (or the enclosing deadline).
  template <typename T, typename Once>
  coio::Task<coio::Result<T>> failover(Once& once, Clock::duration attemptTimeout, bool resend) {
    Clock::duration backoff = options_.backoffMin;
    std::size_t failures = 0;
    for (std::size_t index = preferred_;; index = (index + 1) % endpoints_.size()) {
      Endpoint& endpoint = endpoints_[index];
      coio::Result<Attempt<T>> timed = co_await coio::withTimeout(reactor_, once(endpoint), attemptTimeout);
      if (!timed && timed.error() == std::errc::timed_out) {
        // It accepted and did not answer in time: later calls start elsewhere.
        endpoint.silentSince = reactor_.now();
        timed = Attempt<T>{std::errc::timed_out, resend};
      }
      if (!timed) co_return timed.error();  // the call's own deadline or stop
      Attempt<T>& attempt = *timed;
      if (!attempt.retry) {
        if (attempt.result.error() == std::errc::timed_out) demote(index);
        co_return std::move(attempt.result);
      }
      std::string what = attempt.result.error().message();
      if (!lastMessage_.empty()) what += ": " + std::exchange(lastMessage_, {});  // etcd's words, if it spoke
      note(endpoint, what);
      demote(index);
      if (++failures % endpoints_.size() == 0) {
        const bool slept = co_await reactor_.sleepFor(backoff, co_await coio::currentStopToken());
        if (!slept) co_return std::errc::operation_canceled;
        backoff = std::min(backoff * 2, options_.backoffMax);
      }
    }
  }

  coio::Task<coio::Result<Connection>> connection(Endpoint& endpoint) {
    if (!endpoint.idle.empty()) {
      Connection c{std::move(endpoint.idle.back()), true};
      endpoint.idle.pop_back();
      co_return std::move(c);
    }
    coio::Result<http1::HttpConnection<R>> http =
        co_await http1::HttpConnection<R>::connect(reactor_, endpoint.address, options_.limits);
    if (!http) co_return http.error();
    co_return Connection{std::move(*http), false};
  }

  // One request on one endpoint, its reply decoded as T.
  template <typename T>
  coio::Task<Attempt<T>> exchange(Endpoint& endpoint, std::string_view path, const std::string& body, Kind kind) {
    coio::Result<Connection> c = co_await connection(endpoint);
    if (!c) co_return Attempt<T>{c.error(), retryable(c.error())};
    http1::HttpConnection<R>& http = c->http;
    coio::Result<void> sent = co_await http.post(endpoint.host, path, body);
    // A request that did not all go out cannot have been applied.
    if (!sent) co_return Attempt<T>{sent.error(), retryable(sent.error())};
    // Idempotent calls may be retried after any transport failure; others
    // only if a reused connection ended before a byte came back.
    const auto lost = [&](std::error_code ec) {
      return retryable(ec) && (kind != Kind::write || (c->reused && !http.heardBack()));
    };
    coio::Result<int> status = co_await http.readHead();
    if (!status) co_return Attempt<T>{status.error(), lost(status.error())};
    coio::Result<std::string> reply = co_await readReply(http, kind == Kind::keepAlive);
    if (!reply) co_return Attempt<T>{reply.error(), lost(reply.error())};
    if (kind != Kind::keepAlive && http.reusable() && endpoint.idle.size() < options_.idleConnections) {
      endpoint.idle.push_back(std::move(http));
    }
    coio::Result<T> value = decodeReply<T>(*reply, *status, kind == Kind::keepAlive);
    const bool retry = !value && value.error() == EtcdErrc::unavailable && kind != Kind::write;
    co_return Attempt<T>{std::move(value), retry};
  }

  // The body; of a stream (the keep-alive's), its first message only.
  coio::Task<coio::Result<std::string>> readReply(http1::HttpConnection<R>& http, bool firstMessage) {
    if (!firstMessage) co_return co_await http.readWholeBody();
    std::string body;
    for (;;) {
      coio::Result<bool> done = co_await http.readBody(body);  // bounded by Limits::maxBodyBytes
      if (!done) co_return done.error();
      if (const std::size_t end = body.find('\n'); end != std::string::npos) {
        body.resize(end);
        break;
      }
      if (*done) break;
    }
    co_return std::move(body);
  }

  // A reply's JSON as T: etcd's error replies as EtcdErrc, a stream's
  // message unwrapped from its {"result": ...}.
  template <typename T>
  coio::Result<T> decodeReply(std::string_view text, int status, bool streamed) {
    std::string why;
    coio::Result<Json> json = parseJson(text, why);
    if (json) {
      if (std::optional<EtcdFailure> failure = decodeFailure(*json)) {
        lastMessage_ = failure->message;
        return failure->code;
      }
    }
    if (status != 200) {
      lastMessage_ = "HTTP status " + std::to_string(status);
      return EtcdErrc::httpStatus;
    }
    if (!json) {
      lastMessage_ = why;
      return json.error();
    }
    const Json* payload = &*json;
    if (streamed) {
      const auto result = json->find("result");
      if (result == json->end()) {
        lastMessage_ = "stream message without a result";
        return EtcdErrc::badResponse;
      }
      payload = &*result;
    }
    coio::Result<T> value = decode<T>(*payload, why);
    if (!value) lastMessage_ = why;
    if constexpr (std::is_same_v<T, Lease>) {
      // A keep-alive of an unknown lease answers with no TTL.
      if (value && streamed && value->ttl <= 0) {
        lastMessage_ = "lease " + std::to_string(value->id) + " not found";
        return EtcdErrc::leaseNotFound;
      }
    }
    return value;
  }

  // Transport failures another endpoint may not have; not a cancellation
  // (the deadline), nor a reply that was read and refused.
  static bool retryable(std::error_code ec) noexcept {
    if (ec == std::errc::operation_canceled) return false;
    return ec.category() == std::system_category() || ec.category() == std::generic_category() ||
           ec == coio::Errc::eof || ec == http1::HttpErrc::truncated;
  }

  // Endpoint `index` failed: later calls start at the next one, unless
  // another call has moved them on already (overlapping calls that failed on
  // it move them once).
  void demote(std::size_t index) noexcept {
    if (preferred_ == index) preferred_ = (index + 1) % endpoints_.size();
  }

  void note(const Endpoint& endpoint, const std::string& what) {
    lastError_ = endpoint.host + ": " + what;
    if (options_.log) options_.log("etcd " + lastError_);
  }

  // Records a call's failure for lastError() and the log; returns it.
  std::error_code failed(std::error_code ec, std::string_view what, Clock::duration timeout) {
    std::string line(what);
    if (ec == std::errc::timed_out) {
      line += ": no answer within " +
              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count()) + " ms";
      if (!lastError_.empty()) line += " (last: " + lastError_ + ")";
    } else {
      line += ": " + ec.message();
      if (!lastMessage_.empty()) line += ": " + lastMessage_;
    }
    lastMessage_.clear();
    lastError_ = std::move(line);
    if (options_.log) options_.log("etcd " + lastError_);
    return ec;
  }

  R& reactor_;
  EtcdOptions options_;
  std::vector<Endpoint> endpoints_;
  std::size_t preferred_ = 0;  // where the next call starts
  std::string lastError_;
  std::string lastMessage_;  // etcd's words (or a refusal's reason) for the call failing now
};

/// A watch of a key or range (EtcdClient::watch): etcd's watch stream, one
/// long-lived HTTP response of newline-separated JSON messages, handed out
/// as batches of events.
///
/// Guarantees:
/// - Used on the client's loop thread; next() resumes there. One next() at
///   a time.
/// - No event is missed or repeated: batches come in revision order; when
///   the stream is lost (etcd restarted, a member died), next() reconnects
///   through the client's failover and backoff and resumes at the revision
///   after the last event received (nextRevision()). If etcd compacted
///   that revision meanwhile, the events in between are lost: next() then
///   fails with EtcdErrc::compacted, for good; compactRevision() is the
///   oldest revision left (read the state afresh, then watch from there).
/// - next(timeout) returns within timeout: std::errc::timed_out if no event
///   came, and the watch goes on; events that arrive as the deadline fires
///   are kept for the next call. A reply not understood (HttpErrc,
///   EtcdErrc::badResponse) or one etcd refused is returned at once and the
///   stream dropped; the next call reconnects.
/// - Destroy it (on the loop thread) when no next() is pending; that ends
///   the stream.
template <coio::Reactor R>
class EtcdWatch {
 public:
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  /// The next batch of events, waiting up to `timeout` for one.
  coio::Task<coio::Result<WatchBatch>> next(Clock::duration timeout) {
    if (stream_ && streamEndpoint_->silentSince > streamOpened_) {
      // Its member stopped answering the client's calls: a stream there
      // would stay silent, events unseen. Resumes elsewhere, from nextRevision_.
      client_.note(*streamEndpoint_, "watch moved: the member stopped answering");
      stream_.reset();
    }
    if (ready_.empty() && !terminal_) {
      coio::Result<void> filled = co_await coio::withTimeout(client_.reactor_, fill(), timeout);
      if (!filled && ready_.empty()) {
        if (filled.error() == std::errc::timed_out) co_return filled.error();  // a quiet watch is no failure
        co_return client_.failed(filled.error(), "watch", timeout);
      }
    }
    if (ready_.empty()) {
      client_.lastMessage_ = terminalMessage_;
      co_return client_.failed(terminal_, "watch", timeout);
    }
    WatchBatch batch = std::move(ready_.front());
    ready_.pop_front();
    co_return std::move(batch);
  }

  /// The revision the watch resumes from after a reconnection: the one after
  /// the last event received (or after the revision it was created at).
  std::int64_t nextRevision() const noexcept { return nextRevision_; }
  /// After EtcdErrc::compacted: the oldest revision etcd still has.
  std::int64_t compactRevision() const noexcept { return compactRevision_; }

 private:
  friend class EtcdClient<R>;
  using Client = EtcdClient<R>;
  using Endpoint = typename Client::Endpoint;

  EtcdWatch(Client& client, WatchRequest request, Clock::duration attemptTimeout)
      : client_(client),
        request_(std::move(request)),
        attemptTimeout_(attemptTimeout),
        nextRevision_(request_.startRevision) {}

  // Opens the stream (failing over between endpoints, each given
  // attemptTimeout_ to create the watch) and waits until etcd created it.
  coio::Task<coio::Result<void>> open() {
    auto once = [this](Endpoint& endpoint) { return openOn(endpoint); };
    co_return co_await client_.template failover<void>(once, attemptTimeout_, /*resend=*/true);
  }

  coio::Task<typename Client::template Attempt<void>> openOn(Endpoint& endpoint) {
    using Attempt = typename Client::template Attempt<void>;
    coio::Result<typename Client::Connection> c = co_await client_.connection(endpoint);
    if (!c) co_return Attempt{c.error(), Client::retryable(c.error())};
    WatchRequest from = request_;
    from.startRevision = nextRevision_;
    coio::Result<void> sent = co_await c->http.post(endpoint.host, "/v3/watch", encode(from), /*streamed=*/true);
    if (!sent) co_return Attempt{sent.error(), Client::retryable(sent.error())};
    coio::Result<int> status = co_await c->http.readHead();
    if (!status) co_return Attempt{status.error(), Client::retryable(status.error())};
    if (*status != 200) {
      coio::Result<std::string> reply = co_await c->http.readWholeBody();
      if (!reply) co_return Attempt{reply.error(), Client::retryable(reply.error())};
      coio::Result<WatchMessage> refused = client_.template decodeReply<WatchMessage>(*reply, *status, true);
      co_return Attempt{refused ? std::error_code(EtcdErrc::badResponse) : refused.error(), false};
    }
    stream_.emplace(std::move(c->http));
    streamEndpoint_ = &endpoint;
    streamOpened_ = client_.reactor_.now();
    pending_.clear();
    ended_ = false;
    created_ = false;
    while (!created_ && !terminal_) {
      coio::Result<void> step = takeBuffered(/*untilCreated=*/true);
      if (step && !created_ && !terminal_) step = co_await readMore();
      if (!step) {
        stream_.reset();
        co_return Attempt{step.error(), lost(step.error())};
      }
    }
    co_return Attempt{terminal_, false};
  }

  // Until a batch is ready (or the watch ended): takes the messages the
  // stream brings, reopening it when it is lost.
  coio::Task<coio::Result<void>> fill() {
    while (ready_.empty() && !terminal_) {
      if (!stream_) {
        coio::Result<void> opened = co_await open();
        if (!opened) co_return opened.error();
        continue;
      }
      coio::Result<void> step = takeBuffered(/*untilCreated=*/false);
      if (step && (!ready_.empty() || terminal_)) break;
      if (step) step = co_await readMore();
      if (step || step.error() == std::errc::operation_canceled) {  // cancelled: the stream stays, intact
        if (!step) co_return step.error();
        continue;
      }
      stream_.reset();
      if (!lost(step.error())) co_return step.error();
      client_.note(*streamEndpoint_, "watch stream lost: " + step.error().message());
      // Not straight back to an endpoint that just dropped the stream.
      const bool slept =
          co_await client_.reactor_.sleepFor(client_.options_.backoffMin, co_await coio::currentStopToken());
      if (!slept) co_return std::errc::operation_canceled;
    }
    co_return coio::Result<void>{};
  }

  // Whether a failure of the stream is its loss (reconnect), not a reply refused.
  static bool lost(std::error_code ec) { return Client::retryable(ec) || ec == EtcdErrc::unavailable; }

  // Reads more of the stream into pending_; Errc::eof once the stream
  // ended and every message it held was taken.
  coio::Task<coio::Result<void>> readMore() {
    if (ended_) co_return coio::Errc::eof;
    coio::Result<bool> ended = co_await stream_->readBody(pending_);
    if (!ended) co_return ended.error();
    ended_ = *ended;
    co_return coio::Result<void>{};
  }

  // Takes complete messages from pending_ until one brought events, or
  // (`untilCreated`) the creation, or the end of the watch. A message
  // refused is consumed and its error returned; what came before it is
  // kept (a batch is handed out first, the error on the call after).
  coio::Result<void> takeBuffered(bool untilCreated) {
    std::size_t end;
    while (ready_.empty() && !(untilCreated && created_) && !terminal_ &&
           (end = pending_.find('\n')) != std::string::npos) {
      const std::string line = pending_.substr(0, end);
      pending_.erase(0, end + 1);
      if (coio::Result<void> taken = take(line); !taken) return taken;
    }
    if (ready_.empty() && pending_.size() > client_.options_.limits.maxBodyBytes &&
        pending_.find('\n') == std::string::npos) {
      return http1::HttpErrc::bodyTooLarge;  // a message over the bound
    }
    return {};
  }

  // One message of the stream.
  coio::Result<void> take(std::string_view line) {
    if (line.empty()) return {};
    coio::Result<WatchMessage> m = client_.template decodeReply<WatchMessage>(line, 200, true);
    if (!m) return m.error();
    if (m->canceled) {
      compactRevision_ = m->compactRevision;
      terminal_ = m->compactRevision > 0 ? EtcdErrc::compacted : EtcdErrc::watchCanceled;
      terminalMessage_ = m->compactRevision > 0
                             ? "watch from revision " + std::to_string(nextRevision_) +
                                   " compacted; oldest left " + std::to_string(m->compactRevision)
                             : "watch canceled: " + m->cancelReason;
      return {};
    }
    if (m->created) {
      created_ = true;
      if (nextRevision_ == 0) nextRevision_ = m->header.revision + 1;
    }
    if (!m->events.empty()) {
      nextRevision_ = m->events.back().kv.modRevision + 1;
      ready_.push_back(WatchBatch{m->header, std::move(m->events)});
    }
    return {};
  }

  Client& client_;
  WatchRequest request_;
  Clock::duration attemptTimeout_;  // for each endpoint to create the watch on (re)opening
  std::int64_t nextRevision_;  // 0: from when etcd creates the watch
  std::int64_t compactRevision_ = 0;
  std::optional<http1::HttpConnection<R>> stream_;
  const Endpoint* streamEndpoint_ = nullptr;  // where stream_ goes
  Clock::time_point streamOpened_{};
  std::string pending_;                       // stream bytes not yet taken as messages
  bool ended_ = false;                        // the stream's response is complete
  bool created_ = false;
  std::deque<WatchBatch> ready_;
  std::error_code terminal_;  // compacted or canceled: the watch is over
  std::string terminalMessage_;
};

/// Keeps lease `leaseId` (of `ttl`) alive until `stop`: a keep-alive every
/// ttl/3 (at a fixed rate: a slow one does not push the next back), each
/// with ttl/3 to answer, of which a member that does not answer takes one
/// share (EtcdClient's failover): one lost keep-alive (etcd restarting, a
/// member failing over or stopped) costs nothing. Returns success once
/// stopped; EtcdErrc::leaseNotFound as soon as etcd says the lease is gone
/// (it expired while etcd could not be reached, or was revoked): whatever
/// was bound to it must be registered again. Transport failures and
/// timeouts are retried at the next tick. Runs on the client's loop thread.
template <coio::Reactor R>
coio::Task<coio::Result<void>> keepLeaseAlive(EtcdClient<R>& client, std::int64_t leaseId, Clock::duration ttl,
                                              std::stop_token stop) {
  R& reactor = client.reactor();
  const Clock::duration tick = std::max<Clock::duration>(ttl / 3, std::chrono::milliseconds(100));
  for (Clock::time_point due = reactor.now() + tick;; due += tick) {
    const Clock::duration wait = std::max(due - reactor.now(), Clock::duration::zero());
    if (!co_await reactor.sleepFor(wait, stop)) co_return coio::Result<void>{};
    due = std::max(due, reactor.now());  // after a stall of the whole process: no burst to catch up
    coio::Result<Lease> renewed = co_await coio::withStopToken(stop, client.leaseKeepAlive(leaseId, tick));
    if (stop.stop_requested()) co_return coio::Result<void>{};
    if (!renewed && renewed.error() == EtcdErrc::leaseNotFound) co_return renewed.error();
  }
}

}  // namespace storage::etcd
