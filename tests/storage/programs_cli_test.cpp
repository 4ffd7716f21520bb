// The programs' command lines, run as child processes: a bad value or an
// unknown option is one line on stderr and exit code 2, naming the option;
// --help is exit 0 with the help on stdout; a good command line runs.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Ran {
  int exitCode = -1;
  std::string out, err;
};

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Starts `program` with `args`, its stdout and stderr into the files `out`
// and `err`; its pid.
pid_t spawnProgram(const char* program, std::vector<std::string> args, const std::filesystem::path& out,
                   const std::filesystem::path& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(spawned == 0);
  return pid;
}

// Runs `program` with `args` to its end, its stdout and stderr in files.
Ran runProgram(const char* program, std::vector<std::string> args) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::string tag = std::to_string(::getpid());
  const std::filesystem::path out = dir / ("coio-cli-test-" + tag + ".out"), err = dir / ("coio-cli-test-" + tag + ".err");
  const pid_t pid = spawnProgram(program, std::move(args), out, err);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  Ran ran{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return ran;
}

std::size_t lines(const std::string& text) { return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')); }

// A bad command line: exit 2, nothing on stdout, one line on stderr that
// begins with the program's name and holds `mention`.
void checkRefused(const char* program, std::vector<std::string> args, const std::string& mention) {
  const Ran ran = runProgram(program, std::move(args));
  INFO("stderr: " << ran.err);
  CHECK(ran.exitCode == 2);
  CHECK(ran.out.empty());
  CHECK(lines(ran.err) == 1);
  CHECK(ran.err.rfind(std::filesystem::path(program).filename().string() + ": ", 0) == 0);
  CHECK(ran.err.find(mention) != std::string::npos);
}

}  // namespace

TEST_CASE("coio-storage-server refuses a bad command line with one line and exit code 2", "[storage][cli]") {
  const char* server = COIO_STORAGE_SERVER_BIN;
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--reactors", "0"}, "--reactors");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--piece-size", "5000"}, "--piece-size");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--frame-timeout-ms", "ten"}, "--frame-timeout-ms");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--target", "x=/tmp"}, "--target");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--transport", "udp"}, "--transport");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--data-path", "sendfile"}, "--data-path");
  checkRefused(server, {"serve", "--dir", "/nonexistent", "--bogus", "1"}, "--bogus");
  checkRefused(server, {"serve", "--target", "0=/a", "--target", "0=/b"}, "target 0 given twice");
  checkRefused(server, {"init", "--dir", "/nonexistent", "--chunks", "8", "--chunk-size", "4Q"}, "--chunk-size");
  checkRefused(server, {"init", "--dir", "/nonexistent", "--chunks", "8"}, "init needs --dir, --chunks and --chunk-size");
  checkRefused(server, {"mgmtd", "--id", "m"}, "--etcd");
  checkRefused(server, {"cluster", "load"}, "FILE");
  checkRefused(server, {"nonsense"}, "nonsense");
  checkRefused(server, {}, "subcommand");
}

TEST_CASE("coio-storage-bench refuses a bad command line with one line and exit code 2", "[storage][cli]") {
  const char* bench = COIO_STORAGE_BENCH_BIN;
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--io-size", "4Q"}, "--io-size");
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--depth", "0"}, "--depth");
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--etcd", "a,,b"}, "--etcd");
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--io-size", "2M"}, "--io-size is larger than a chunk");
  checkRefused(bench, {"--io-size", "4K"}, "dataset's shape");
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--reactors", "0"}, "--reactors");
  checkRefused(bench, {"--chunks", "8", "--chunk-size", "1M", "--connections", "2", "--reactors", "3"},
               "--reactors is more than --connections");
  checkRefused(bench, {"--cluster", "/nonexistent", "--reactors", "2"}, "a cluster client runs on one reactor");
}

TEST_CASE("The bench spreads its connections over --reactors threads, against a server of two, every byte right",
          "[storage][cli]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("coio-cli-test-mt-" + std::to_string(::getpid()));
  REQUIRE(runProgram(COIO_STORAGE_SERVER_BIN, {"init", "--dir", dir.string(), "--chunks", "8", "--chunk-size", "1M"})
              .exitCode == 0);
  const std::filesystem::path log = dir / "server.log";
  const pid_t server = spawnProgram(COIO_STORAGE_SERVER_BIN,
                                    {"serve", "--dir", dir.string(), "--listen", "127.0.0.1:0", "--reactors", "2",
                                     "--buffered"},
                                    log, dir / "server.err");
  std::string address;
  for (int i = 0; i < 100 && address.empty(); ++i) {
    const std::string text = slurp(log);
    if (const std::size_t at = text.find("listening on "); at != std::string::npos && text.find('\n', at) != std::string::npos) {
      address = text.substr(at + 13, text.find('\n', at) - at - 13);
    } else {
      ::usleep(100'000);
    }
  }
  Ran ran;
  if (!address.empty()) {
    ran = runProgram(COIO_STORAGE_BENCH_BIN, {"--address", address, "--dir", dir.string(), "--io-size", "64K",
                                              "--connections", "3", "--reactors", "2", "--depth", "5", "--duration",
                                              "1", "--verify", "--json"});
  }
  ::kill(server, SIGTERM);
  int status = 0;
  ::waitpid(server, &status, 0);
  std::filesystem::remove_all(dir);
  REQUIRE(!address.empty());
  INFO("stdout: " << ran.out << "stderr: " << ran.err);
  CHECK(ran.exitCode == 0);  // 0: IOs were read and none failed or had a wrong byte
  CHECK(ran.out.find("\"reactors\":2,\"connections\":3") != std::string::npos);
  CHECK(ran.out.find("\"errors\":{\"total\":0") != std::string::npos);
  CHECK(ran.out.find("\"ios\":0,") == std::string::npos);
  CHECK(WIFEXITED(status));
}

TEST_CASE("The programs print their help on stdout and exit 0", "[storage][cli]") {
  const Ran server = runProgram(COIO_STORAGE_SERVER_BIN, {"serve", "--help"});
  CHECK(server.exitCode == 0);
  CHECK(server.err.empty());
  CHECK(server.out.find("--piece-size") != std::string::npos);
  CHECK(server.out.find("--data-path") != std::string::npos);
  const Ran bench = runProgram(COIO_STORAGE_BENCH_BIN, {"--help"});
  CHECK(bench.exitCode == 0);
  CHECK(bench.out.find("--io-size") != std::string::npos);
}

TEST_CASE("init takes sizes with binary suffixes and writes the dataset", "[storage][cli]") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("coio-cli-test-ds-" + std::to_string(::getpid()));
  const Ran ran = runProgram(COIO_STORAGE_SERVER_BIN, {"init", "--dir", dir.string(), "--chunks", "3", "--chunk-size",
                                                       "64K", "--chunks-per-file", "2", "--block-size", "8k"});
  INFO("stderr: " << ran.err);
  CHECK(ran.exitCode == 0);
  CHECK(ran.out.find("3 chunks of 65536 bytes in 2 data file(s), a CRC32C per 8192 bytes") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "index"));
  std::filesystem::remove_all(dir);
}
