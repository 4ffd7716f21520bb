#pragma once
// A stop source that an enclosing token stops too: collectAny's and
// withTimeout's children run under its token, which the operation also
// stops itself (a winner, a deadline).
#include <coio/core/detail/assert.hpp>

#include <optional>
#include <stop_token>

namespace coio::detail {

class LinkedStopSource {
 public:
  LinkedStopSource() = default;
  LinkedStopSource(const LinkedStopSource&) = delete;
  LinkedStopSource& operator=(const LinkedStopSource&) = delete;

  /// From now on a stop of `*parent` (null: none) stops this source too, at
  /// once if it already was. Returns the token to run the children under.
  const std::stop_token* linkTo(const std::stop_token* parent) noexcept {
    COIO_ASSERT(!link_, "LinkedStopSource linked twice");
    if (parent) link_.emplace(*parent, Forward{&source_});
    return &token_;
  }

  /// Stops the children's token; their stop callbacks run on this thread.
  /// The caller must outlive the call (a collectAny child that has not
  /// arrived yet does).
  void requestStop() noexcept { source_.request_stop(); }

 private:
  struct Forward {
    std::stop_source* source;
    // Through a copy, which keeps the stop state alive: stopping the
    // children may finish them, and the last to finish resumes the
    // operation that owns *source, inline, which may then destroy it
    // before request_stop() has returned.
    void operator()() const noexcept { std::stop_source(*source).request_stop(); }
  };

  std::stop_source source_;
  std::stop_token token_ = source_.get_token();
  std::optional<std::stop_callback<Forward>> link_;  // last: unlinked first on destruction
};

}  // namespace coio::detail
