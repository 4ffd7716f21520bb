#pragma once
// Sole ownership of a coroutine frame: move-only, and the frame is
// destroyed with its owner (the generators hold their bodies in one).
#include <coroutine>
#include <utility>

namespace coio::detail {

template <typename Promise>
class OwnedCoroutine {
 public:
  OwnedCoroutine() noexcept = default;
  explicit OwnedCoroutine(std::coroutine_handle<Promise> h) noexcept : handle_(h) {}
  OwnedCoroutine(OwnedCoroutine&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  OwnedCoroutine& operator=(OwnedCoroutine&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~OwnedCoroutine() { reset(); }

  // Null once moved from.
  std::coroutine_handle<Promise> get() const noexcept { return handle_; }

 private:
  void reset() noexcept {
    if (handle_) std::exchange(handle_, nullptr).destroy();
  }

  std::coroutine_handle<Promise> handle_;
};

}  // namespace coio::detail
