#pragma once
// A forked child process that a test kills: whatever path the test takes
// (an assertion that throws included), it is SIGKILLed and reaped at the end.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

namespace coio::testing {

class KilledAtEnd {
 public:
  explicit KilledAtEnd(pid_t pid) noexcept : pid_(pid) {}
  KilledAtEnd(const KilledAtEnd&) = delete;
  KilledAtEnd& operator=(const KilledAtEnd&) = delete;
  ~KilledAtEnd() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }

 private:
  pid_t pid_;
};

}  // namespace coio::testing
