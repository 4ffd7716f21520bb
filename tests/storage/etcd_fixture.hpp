#pragma once
// Real etcd for the tests: one member or a cluster of several, each an
// `etcd` child process on free loopback ports with a fresh data directory
// (in /dev/shm when there is one: etcd fsyncs every write). Members can be
// stopped (SIGTERM or SIGKILL) and started again on the same ports and
// data. Every child is SIGKILLed and reaped when the fixture is destroyed,
// however the test ended, and dies with the test process (PDEATHSIG).
// No etcd installed is a test failure, never a skip.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace storage::testing {

/// Where the tests find etcd: $COIO_ETCD, else /usr/bin/etcd (Debian's etcd-server).
inline std::string etcdBinary() {
  const char* path = std::getenv("COIO_ETCD");
  return path ? path : "/usr/bin/etcd";
}

/// A loopback TCP port free now, for a process started later to listen on.
/// Drawn below the kernel's ephemeral range (ip_local_port_range), not
/// bind(0)'s pick from inside it: a port from that range can be taken, in
/// between, as the local port of any test's outgoing connection (CI saw an
/// etcd member fail to start so: "bind: address already in use"). Never
/// the same port twice in one process: a cluster's ports are all distinct
/// though none is bound yet.
inline std::uint16_t freeLoopbackPort() {
  unsigned ephemeralLow = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeralLow;
  const unsigned low = 20000, high = std::max(low + 1000, ephemeralLow) - 1;
  static thread_local std::mt19937 random{std::random_device{}()};
  static thread_local std::set<std::uint16_t> given;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const auto port = static_cast<std::uint16_t>(std::uniform_int_distribution<unsigned>(low, high)(random));
    if (given.count(port) > 0) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (bound) {
      given.insert(port);
      return port;
    }
  }
  FAIL("no free loopback port between 20000 and the ephemeral range");
  return 0;
}

/// An etcd cluster of `members` processes on loopback.
class EtcdCluster {
 public:
  /// Starts every member and waits (up to 20 s) until each is healthy
  /// (has a leader); the test fails, with the member's log, if not.
  explicit EtcdCluster(std::size_t members = 1) {
    INFO("etcd is needed at " << etcdBinary() << " (scripts/install-deps.sh installs Debian's etcd-server)");
    REQUIRE(::access(etcdBinary().c_str(), X_OK) == 0);
    const std::filesystem::path base =
        std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    std::string tmpl = (base / "coio-etcd-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    for (std::size_t i = 0; i < members; ++i) {
      members_.push_back({"m" + std::to_string(i), freeLoopbackPort(), freeLoopbackPort(), 0});
    }
    try {
      for (std::size_t i = 0; i < members; ++i) spawn(i);
      for (std::size_t i = 0; i < members; ++i) waitHealthy(i);
    } catch (...) {  // a failed start: no destructor will run
      cleanUp();
      throw;
    }
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;
  ~EtcdCluster() { cleanUp(); }

  std::size_t size() const noexcept { return members_.size(); }
  /// Member i's client URL.
  std::string endpoint(std::size_t i) const { return "http://127.0.0.1:" + std::to_string(members_[i].clientPort); }
  /// Every member's client URL.
  std::vector<std::string> endpoints() const {
    std::vector<std::string> urls;
    for (std::size_t i = 0; i < members_.size(); ++i) urls.push_back(endpoint(i));
    return urls;
  }
  bool running(std::size_t i) const noexcept { return members_[i].pid != 0; }

  /// Sends `signal` to member i and reaps it (SIGKILL after 10 s).
  void stop(std::size_t i, int signal = SIGTERM) {
    REQUIRE(running(i));
    reap(members_[i], signal);
  }
  /// Sends `signal` to member i and leaves it running (SIGSTOP, SIGCONT).
  void signal(std::size_t i, int signal) const {
    REQUIRE(running(i));
    REQUIRE(::kill(members_[i].pid, signal) == 0);
    if (signal == SIGSTOP) {  // stopped for sure before the test goes on
      int status = 0;
      REQUIRE(::waitpid(members_[i].pid, &status, WUNTRACED) == members_[i].pid);
      REQUIRE(WIFSTOPPED(status));
    }
  }
  /// Starts member i again, on its ports and data, and waits until healthy.
  void start(std::size_t i) {
    REQUIRE(!running(i));
    spawn(i);
    waitHealthy(i);
  }

  /// Which member leads now (asked of each running member, by the
  /// gateway's maintenance status: its own id against its leader's).
  std::size_t leader() const {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (!running(i)) continue;
      const std::string body = "{}";
      const std::string reply = exchange(i, "POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                            "Connection: close\r\nContent-Length: 2\r\n\r\n" + body);
      const std::size_t json = reply.find("\r\n\r\n");
      if (json == std::string::npos) continue;
      const std::string status = reply.substr(json + 4);
      const std::size_t id = status.find("\"member_id\":\"");
      const std::size_t leader = status.find("\"leader\":\"");
      if (id == std::string::npos || leader == std::string::npos) continue;
      const auto valueAt = [&](std::size_t at) {
        const std::size_t begin = status.find(':', at) + 2;
        return status.substr(begin, status.find('"', begin) - begin);
      };
      if (valueAt(id) == valueAt(leader)) return i;
    }
    FAIL("no etcd member says it leads");
    return 0;
  }

  /// Member i's log (its stderr).
  std::string log(std::size_t i) const {
    std::ifstream in(logPath(i));
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  struct Member {
    std::string name;
    std::uint16_t clientPort;
    std::uint16_t peerPort;
    pid_t pid;
  };

  void cleanUp() noexcept {
    for (Member& m : members_) reap(m, SIGKILL);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string logPath(std::size_t i) const { return (dir_ / (members_[i].name + ".log")).string(); }

  void spawn(std::size_t i) {
    const Member& m = members_[i];
    std::string cluster;
    for (const Member& other : members_) {
      cluster += (cluster.empty() ? "" : ",") + other.name + "=http://127.0.0.1:" + std::to_string(other.peerPort);
    }
    const std::string client = "http://127.0.0.1:" + std::to_string(m.clientPort);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peerPort);
    // Fast elections: a killed leader is replaced in well under a second.
    std::vector<std::string> args{etcdBinary(),
                                  "--name", m.name,
                                  "--data-dir", (dir_ / m.name).string(),
                                  "--listen-client-urls", client,
                                  "--advertise-client-urls", client,
                                  "--listen-peer-urls", peer,
                                  "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", cluster,
                                  "--initial-cluster-token", dir_.filename().string(),
                                  "--heartbeat-interval", "50",
                                  "--election-timeout", "500",
                                  "--logger", "zap",
                                  "--log-level", "warn"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string logFile = logPath(i);
    const pid_t parent = ::getpid();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // Dies with the test, however the test ends (a ctest timeout included).
      if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(1);
      const int log = ::open(logFile.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (log < 0 || ::dup2(log, STDOUT_FILENO) < 0 || ::dup2(log, STDERR_FILENO) < 0) ::_exit(2);
      ::execv(argv[0], argv.data());
      ::_exit(3);
    }
    members_[i].pid = child;
  }

  // Sends `request` to member i's client port and reads the reply until
  // the server closes (the request says Connection: close) or half a
  // second passes without a byte; empty if the member cannot be reached.
  std::string exchange(std::size_t i, const std::string& request) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return {};
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(members_[i].clientPort);
    std::string reply;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      pollfd p{fd, POLLIN, 0};
      char buffer[1024];
      while (::poll(&p, 1, 500) == 1) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        reply.append(buffer, static_cast<std::size_t>(n));
      }
    }
    ::close(fd);
    return reply;
  }

  // Whether GET /health answers {"health":"true"} (the member has a leader).
  bool healthy(std::size_t i) const {
    const std::string reply =
        exchange(i, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    return reply.find("\"health\":\"true\"") != std::string::npos;
  }

  void waitHealthy(std::size_t i) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!healthy(i)) {
      int status = 0;
      const bool exited = ::waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid;
      if (exited) members_[i].pid = 0;
      if (exited || std::chrono::steady_clock::now() > deadline) {
        INFO("etcd member " << members_[i].name << (exited ? " exited" : " not healthy in 20 s") << "; its log:\n"
                            << log(i));
        FAIL("etcd did not start");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  static void reap(Member& m, int signal) noexcept {
    if (m.pid == 0) return;
    ::kill(m.pid, signal);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int status = 0;
    while (::waitpid(m.pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(m.pid, SIGKILL);
        ::waitpid(m.pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    m.pid = 0;
  }

  std::filesystem::path dir_;
  std::vector<Member> members_;
};

}  // namespace storage::testing
