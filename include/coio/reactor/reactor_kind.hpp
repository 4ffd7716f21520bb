#pragma once
// Choosing a reactor at run time. Needs liburing: link coio::uring.
#include <coio/core/result.hpp>
#include <coio/reactor/epoll_reactor.hpp>
#include <coio/reactor/uring_reactor.hpp>

#include <string>
#include <string_view>
#include <utility>

namespace coio {

/// Which reactor to run: chosen at run time, e.g. from a command line.
enum class ReactorKind { epoll, uring };

/// "epoll" or "uring".
inline std::string_view toString(ReactorKind kind) noexcept { return kind == ReactorKind::epoll ? "epoll" : "uring"; }

/// "epoll" or "uring"; Errc::invalidArgument otherwise.
inline Result<ReactorKind> parseReactorKind(std::string_view text) {
  if (text == "epoll") return ReactorKind::epoll;
  if (text == "uring") return ReactorKind::uring;
  return Errc::invalidArgument;
}

/// `wanted`, unless it is uring and io_uring is unusable here: then epoll,
/// with the reason in `why` (if given).
inline ReactorKind usableReactorKind(ReactorKind wanted, std::string* why = nullptr) {
  if (wanted == ReactorKind::uring && !UringReactor::probe(why)) return ReactorKind::epoll;
  return wanted;
}

/// Constructs a reactor of `kind` and returns `f(reactor)`: the one place a
/// program turns a run-time choice into the compile-time reactor type its
/// awaitables are instantiated with.
template <typename F>
decltype(auto) withReactor(ReactorKind kind, F&& f) {
  if (kind == ReactorKind::uring) {
    UringReactor reactor;
    return std::forward<F>(f)(reactor);
  }
  EpollReactor reactor;
  return std::forward<F>(f)(reactor);
}

}  // namespace coio
