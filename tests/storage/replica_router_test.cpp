#include "client/replica_router.hpp"

#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

namespace {

// Servers 0, 1, 2 (9101, 9102, 9103); chains of two replicas:
//   chain 1 (chunks 0, 3, 6, ...): server 0 target 11, server 1 target 21
//   chain 2 (chunks 1, 4, 7, ...): server 1 target 22, server 2 target 31
//   chain 3 (chunks 2, 5, 8, ...): server 2 target 32, server 0 target 12
storage::RoutedTable table() {
  return {*storage::ChainTable::parse(R"(coio-chains 1
chunks 300
chunk-size 4K
chain 1 127.0.0.1:9101/11 127.0.0.1:9102/21
chain 2 127.0.0.1:9102/22 127.0.0.1:9103/31
chain 3 127.0.0.1:9103/32 127.0.0.1:9101/12
)",
                                     "test"),
          {0, 1, 2}};  // slots: the table's server indices
}

std::vector<std::size_t> all(std::size_t n) {
  std::vector<std::size_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Every routed IO, which server it went to (SIZE_MAX: unroutable).
std::vector<std::size_t> serverOf(const storage::ReplicaRouter::Routes& routes, std::size_t n) {
  std::vector<std::size_t> server(n, SIZE_MAX);
  for (const storage::SubBatch& b : routes.batches) {
    for (std::size_t io : b.ios) server[io] = b.server;
  }
  return server;
}

}  // namespace

TEST_CASE("Routing: every IO goes to a replica of its chunk's chain; sub-batches per server keep batch order",
          "[router]") {
  const storage::RoutedTable t = table();
  const storage::ReplicaRouter router(3);
  const std::vector<std::uint64_t> chunks = {7, 0, 2, 299, 4, 5, 3, 1, 8, 6, 9, 10};
  const std::vector<std::uint32_t> tried(chunks.size(), 0);
  const storage::ReplicaRouter::Routes routes = router.route(t, chunks, all(chunks.size()), tried, 256);
  CHECK(routes.unroutable.empty());
  std::vector<int> seen(chunks.size(), 0);
  std::size_t previousServer = 0;
  for (const storage::SubBatch& b : routes.batches) {
    CHECK(b.server >= previousServer);  // server order
    previousServer = b.server;
    CHECK(std::is_sorted(b.ios.begin(), b.ios.end()));  // batch order
    REQUIRE(b.positions.size() == b.ios.size());
    REQUIRE(b.targets.size() == b.ios.size());
    for (std::size_t k = 0; k < b.ios.size(); ++k) {
      ++seen[b.ios[k]];
      const storage::Chain& chain = t.table.chains()[chunks[b.ios[k]] % 3];
      const storage::Replica& replica = chain.replicas.at(b.positions[k]);
      CHECK(replica.server == b.server);
      CHECK(replica.targetId == b.targets[k]);
    }
  }
  CHECK(seen == std::vector<int>(chunks.size(), 1));  // each IO exactly once
}

TEST_CASE("Routing spreads a batch: fewest IOs outstanding first, counting this batch's", "[router]") {
  const storage::RoutedTable t = table();
  storage::ReplicaRouter router(3);
  // 60 IOs of chain 1 (servers 0 and 1): half each.
  std::vector<std::uint64_t> chunks;
  for (std::uint64_t c = 0; c < 180; c += 3) chunks.push_back(c);
  const std::vector<std::uint32_t> tried(chunks.size(), 0);
  std::vector<std::size_t> server = serverOf(router.route(t, chunks, all(chunks.size()), tried, 256), chunks.size());
  CHECK(std::count(server.begin(), server.end(), 0u) == 30);
  CHECK(std::count(server.begin(), server.end(), 1u) == 30);
  // Server 0 has 100 IOs outstanding: all go to server 1 until it has as many.
  router.addLoad(0, 100);
  server = serverOf(router.route(t, chunks, all(chunks.size()), tried, 256), chunks.size());
  CHECK(std::count(server.begin(), server.end(), 1u) == 60);
  router.removeLoad(0, 100);
  CHECK(router.load(0) == 0);
}

TEST_CASE("Routing skips replicas tried, on servers marked down, or known corrupt; none left: unroutable",
          "[router]") {
  const storage::RoutedTable t = table();
  storage::ReplicaRouter router(3);
  const std::vector<std::uint64_t> chunks = {0, 1, 2};
  // Chunk 0's replica at position 0 (server 0) was tried: it goes to server 1.
  std::vector<std::uint32_t> tried = {1u, 0, 0};
  CHECK(serverOf(router.route(t, chunks, all(3), tried, 256), 3)[0] == 1);
  // Both tried: unroutable.
  tried[0] = 3u;
  storage::ReplicaRouter::Routes routes = router.route(t, chunks, all(3), tried, 256);
  CHECK(routes.unroutable == std::vector<std::size_t>{0});
  // Server 2 down: chunk 1 (servers 1, 2) goes to 1, chunk 2 (servers 2, 0) to 0.
  tried = {0, 0, 0};
  router.setDown(2, true);
  CHECK(router.isDown(2));
  std::vector<std::size_t> server = serverOf(router.route(t, chunks, all(3), tried, 256), 3);
  CHECK(server[1] == 1);
  CHECK(server[2] == 0);
  // Servers 2 and 0 down: chunk 2 has no replica left.
  router.setDown(0, true);
  routes = router.route(t, chunks, all(3), tried, 256);
  CHECK(routes.unroutable == std::vector<std::size_t>{2});
  router.setDown(0, false);
  router.setDown(2, false);
  // Target 21 (chain 1, position 1, server 1) holds a corrupt chunk 3: chunk 3 avoids it, chunk 0 does not.
  CHECK(router.markCorrupt(21, 3));
  CHECK_FALSE(router.markCorrupt(21, 3));  // known already
  CHECK(router.corruptMask(t.table, 3) == 2u);
  CHECK(router.corruptMask(t.table, 0) == 0u);
  router.addLoad(0, 1000);  // server 0 busy: only corruption sends chunk 3 there
  const std::vector<std::uint64_t> mixed = {3, 0};
  server = serverOf(router.route(t, mixed, all(2), std::vector<std::uint32_t>(2, 0), 256), 2);
  CHECK(server[0] == 0);
  CHECK(server[1] == 1);
}

TEST_CASE("Routing splits a server's share into requests of at most maxIos", "[router]") {
  const storage::RoutedTable t = table();
  storage::ReplicaRouter router(3);
  router.setDown(1, true);  // chain 1's chunks all on server 0
  std::vector<std::uint64_t> chunks;
  for (std::uint64_t c = 0; c < 30; c += 3) chunks.push_back(c);
  const storage::ReplicaRouter::Routes routes =
      router.route(t, chunks, all(chunks.size()), std::vector<std::uint32_t>(chunks.size(), 0), 4);
  REQUIRE(routes.batches.size() == 3);
  CHECK(routes.batches[0].ios == std::vector<std::size_t>{0, 1, 2, 3});
  CHECK(routes.batches[1].ios == std::vector<std::size_t>{4, 5, 6, 7});
  CHECK(routes.batches[2].ios == std::vector<std::size_t>{8, 9});
  for (const storage::SubBatch& b : routes.batches) CHECK(b.server == 0);
}

TEST_CASE("Routing of only some IOs of a batch: indices are the batch's", "[router]") {
  const storage::RoutedTable t = table();
  const storage::ReplicaRouter router(3);
  const std::vector<std::uint64_t> chunks = {0, 1, 2, 3, 4, 5};
  const std::vector<std::size_t> pending = {1, 4, 5};
  const storage::ReplicaRouter::Routes routes =
      router.route(t, chunks, pending, std::vector<std::uint32_t>(chunks.size(), 0), 256);
  std::vector<std::size_t> routed;
  for (const storage::SubBatch& b : routes.batches) routed.insert(routed.end(), b.ios.begin(), b.ios.end());
  std::sort(routed.begin(), routed.end());
  CHECK(routed == pending);
}

TEST_CASE("Routing reads serving replicas only: an offline target gets nothing; a chain with none serving is "
          "unroutable",
          "[router]") {
  storage::RoutedTable t = table();
  // Target 11 (chain 1, server 0) offline: chain 1's chunks all go to target 21 on server 1.
  t.table = *t.table.withChain(storage::markTargetOffline(t.table.chainRecord(0), 11));
  const storage::ReplicaRouter router(3);
  std::vector<std::uint64_t> chunks;
  for (std::uint64_t c = 0; c < 60; ++c) chunks.push_back(c);
  const std::vector<std::uint32_t> tried(chunks.size(), 0);
  storage::ReplicaRouter::Routes routes = router.route(t, chunks, all(chunks.size()), tried, 256);
  CHECK(routes.unroutable.empty());
  for (const storage::SubBatch& b : routes.batches) {
    for (std::uint32_t target : b.targets) CHECK(target != 11);
  }
  const std::vector<std::size_t> server = serverOf(routes, chunks.size());
  for (std::uint64_t c = 0; c < 60; c += 3) CHECK(server[c] == 1);
  // Target 21 offline too: chain 1 has no serving target, its chunks are unroutable; the others are not.
  t.table = *t.table.withChain(storage::markTargetOffline(t.table.chainRecord(0), 21));
  routes = router.route(t, chunks, all(chunks.size()), tried, 256);
  std::vector<std::size_t> expected;
  for (std::size_t c = 0; c < 60; c += 3) expected.push_back(c);
  CHECK(routes.unroutable == expected);
}

TEST_CASE("Routing names servers by slot: a table's servers may sit in any of the router's slots", "[router]") {
  storage::RoutedTable t = table();
  t.slots = {4, 2, 0};  // server 0 (9101) is slot 4, ...
  storage::ReplicaRouter router(5);
  router.setDown(2, true);  // slot 2: server 1 (9102)
  const std::vector<std::uint64_t> chunks = {0, 1};  // chain 1: servers 0, 1; chain 2: servers 1, 2
  const storage::ReplicaRouter::Routes routes =
      router.route(t, chunks, all(2), std::vector<std::uint32_t>(2, 0), 256);
  const std::vector<std::size_t> slot = serverOf(routes, 2);
  CHECK(slot[0] == 4);
  CHECK(slot[1] == 0);
}
