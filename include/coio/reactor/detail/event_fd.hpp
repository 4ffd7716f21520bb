#pragma once
// EventFd: the wake-up channel of a loop (any thread signals, the loop
// watches it), also the disk layer's completion signal under EpollReactor.
#include <coio/reactor/file_descriptor.hpp>
#include <coio/reactor/detail/syscall.hpp>

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace coio::detail {

class EventFd {
 public:
  EventFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    if (!fd_.valid()) throwSystemError(errno, "coio: eventfd");
  }
  int fd() const noexcept { return fd_.get(); }
  void signal() noexcept {
    const std::uint64_t one = 1;
    // Fails only if the counter would overflow, and then the loop is due to wake anyway.
    (void)retryOnEintr([&] { return ::write(fd_.get(), &one, sizeof one); });
  }
  void drain() noexcept {
    std::uint64_t value;
    (void)retryOnEintr([&] { return ::read(fd_.get(), &value, sizeof value); });
  }

 private:
  FileDescriptor fd_;
};

}  // namespace coio::detail
