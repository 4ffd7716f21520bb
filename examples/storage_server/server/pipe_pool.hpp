#pragma once
// The pipes a StorageServer splices pieces through (file -> pipe ->
// socket), made when first needed and kept for the next requests.
#include <coio/core/result.hpp>
#include <coio/reactor/pipe.hpp>
#include <coio/reactor/reactor.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace storage {

/// One reactor's pipes for spliced pieces, one per piece in flight.
///
/// Guarantees:
/// - acquire() yields an empty pipe holding at least `capacity` bytes,
///   kept from an earlier request or made now, or the error that kept one
///   from being made (EMFILE at the fd limit, EPERM past the user's pipe
///   quota: coio::Pipe::make), with no fd leaked.
/// - release() takes a pipe back empty: bytes a failed transfer left in it
///   are discarded, so none reaches a later request. At most `keep` pipes
///   are kept (2 fds each); the others are closed.
/// - Every pipe it closes is forgotten on the reactor first (which may
///   have waited on its ends). Loop thread only; destroyed before the
///   reactor, with no transfer pending on any of its pipes.
template <coio::Reactor R>
class PipePool {
 public:
  PipePool(R& reactor, std::size_t capacity, std::size_t keep) : reactor_(reactor), capacity_(capacity), keep_(keep) {}
  PipePool(const PipePool&) = delete;
  PipePool& operator=(const PipePool&) = delete;
  ~PipePool() {
    for (coio::Pipe& pipe : free_) pipe.close(reactor_);
  }

  coio::Result<coio::Pipe> acquire() {
    ++inUse_;
    if (!free_.empty()) {
      coio::Pipe pipe = std::move(free_.back());
      free_.pop_back();
      return pipe;
    }
    coio::Result<coio::Pipe> made = coio::Pipe::make(capacity_);
    if (!made) --inUse_;
    return made;
  }

  void release(coio::Pipe pipe) noexcept {
    --inUse_;
    (void)pipe.discard();
    if (free_.size() < keep_) {
      free_.push_back(std::move(pipe));
    } else {
      pipe.close(reactor_);
    }
  }

  /// Pipes handed out and not released.
  std::size_t inUse() const noexcept { return inUse_; }
  /// Pipes open: in use, or kept for reuse.
  std::size_t open() const noexcept { return inUse_ + free_.size(); }

 private:
  R& reactor_;
  std::size_t capacity_;
  std::size_t keep_;
  std::size_t inUse_ = 0;
  std::vector<coio::Pipe> free_;
};

/// The pipes one request holds, one per piece: all or none (take()), given
/// back to the pool on destruction.
template <coio::Reactor R>
class PipeLease {
 public:
  explicit PipeLease(PipePool<R>& pool) noexcept : pool_(pool) {}
  PipeLease(const PipeLease&) = delete;
  PipeLease& operator=(const PipeLease&) = delete;
  ~PipeLease() { releaseAll(); }

  /// Takes `count` pipes, or none and the error of the first that could not be had.
  coio::Result<void> take(std::size_t count) {
    pipes.reserve(count);
    while (pipes.size() < count) {
      coio::Result<coio::Pipe> pipe = pool_.acquire();
      if (!pipe) {
        releaseAll();
        return pipe.error();
      }
      pipes.push_back(std::move(*pipe));
    }
    return {};
  }

  std::vector<coio::Pipe> pipes;

 private:
  void releaseAll() noexcept {
    for (coio::Pipe& pipe : pipes) pool_.release(std::move(pipe));
    pipes.clear();
  }

  PipePool<R>& pool_;
};

}  // namespace storage
