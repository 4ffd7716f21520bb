#include "programs/cli.hpp"

#include <catch2/catch.hpp>
#include <sys/resource.h>

TEST_CASE("The server raises its fd limit to the hard limit", "[storage][cli]") {
  rlimit before{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &before) == 0);
  rlimit lowered = before;
  lowered.rlim_cur = std::min<rlim_t>(before.rlim_cur, 256);
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &lowered) == 0);
  const std::uint64_t limit = storage::cli::raiseFdLimit();
  rlimit after{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &after) == 0);
  CHECK(after.rlim_cur == before.rlim_max);
  CHECK(limit == after.rlim_cur);
  (void)::setrlimit(RLIMIT_NOFILE, &before);
}

TEST_CASE("The default connection limit stays well under the fd limit", "[storage][cli]") {
  using storage::cli::defaultMaxConnections;
  CHECK(defaultMaxConnections(1u << 20, 100, 1) == 10000);         // capped
  CHECK(defaultMaxConnections(4096, 96, 1) == 2000);               // half of what is left
  CHECK(defaultMaxConnections(4096, 96, storage::cli::fdsPerConnection(true)) == 1000);
  CHECK(defaultMaxConnections(1024, 2000, 1) == 1);                // nothing left: still one
}
