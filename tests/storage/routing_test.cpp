// The routing model: 3FS's rules for a chain's changes, records and their
// JSON, assemble(), and the cluster status table.
#include "cluster/chain_table.hpp"
#include "cluster/cluster_status.hpp"
#include "cluster/routing_json.hpp"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

namespace {

using storage::ChainRecord;
using storage::ReplicaState;
using storage::TargetRecord;

constexpr const char* kTable = R"(coio-chains 1
chunks 6000
chunk-size 64K
chain 1  127.0.0.1:9101/11  127.0.0.1:9102/21  127.0.0.1:9103/33
chain 2  127.0.0.1:9102/22  127.0.0.1:9103/31
chain 3  127.0.0.1:9103/32  127.0.0.1:9101/12
)";

ChainRecord threeTargets() {
  return {1, 7, {{11, "a", ReplicaState::serving}, {21, "b", ReplicaState::serving}, {33, "c", ReplicaState::serving}}};
}

std::vector<std::uint32_t> order(const ChainRecord& chain) {
  std::vector<std::uint32_t> ids;
  for (const TargetRecord& t : chain.targets) ids.push_back(t.id);
  return ids;
}

// The error message of `parse(text)`, which must fail.
template <typename Parse>
std::string rejection(Parse parse, const std::string& text) {
  std::string why;
  const auto parsed = parse(text, &why);
  REQUIRE_FALSE(parsed);
  CHECK(parsed.error() == coio::Errc::invalidArgument);
  return why;
}

}  // namespace

TEST_CASE("A target marked offline moves to the end of its chain, and the chain's version goes up", "[routing]") {
  const ChainRecord before = threeTargets();
  const ChainRecord after = storage::markTargetOffline(before, 11);
  CHECK(order(after) == std::vector<std::uint32_t>{21, 33, 11});
  CHECK(after.targets.back().state == ReplicaState::offline);
  CHECK(after.targets[0].state == ReplicaState::serving);
  CHECK(after.version == 8);
  // Idempotent: offline again, or a target not in the chain, changes nothing.
  CHECK(storage::markTargetOffline(after, 11) == after);
  CHECK(storage::markTargetOffline(after, 99) == after);
  // A second one goes behind it; offline targets stay last.
  const ChainRecord two = storage::markTargetOffline(after, 21);
  CHECK(order(two) == std::vector<std::uint32_t>{33, 11, 21});
  CHECK(two.version == 9);
}

TEST_CASE("A target marked serving again serves behind those that kept serving, the version goes up", "[routing]") {
  const ChainRecord two = storage::markTargetOffline(storage::markTargetOffline(threeTargets(), 11), 21);
  const ChainRecord back = storage::markTargetServing(two, 21);  // [33, 11 offline, 21 offline] -> [33, 21, 11]
  CHECK(order(back) == std::vector<std::uint32_t>{33, 21, 11});
  CHECK(back.targets[1].state == ReplicaState::serving);
  CHECK(back.targets[2].state == ReplicaState::offline);
  CHECK(back.version == two.version + 1);
  CHECK(storage::markTargetServing(back, 21) == back);  // already serving: no bump
  CHECK(storage::markTargetServing(back, 99) == back);
  const ChainRecord all = storage::markTargetServing(back, 11);
  CHECK(order(all) == std::vector<std::uint32_t>{33, 21, 11});  // the last one stays at the end
  CHECK(all.version == back.version + 1);
}

TEST_CASE("A file's table: every chain version 1, every target serving, servers named by address",
          "[routing]") {
  const storage::ChainTable table = *storage::ChainTable::parse(kTable, "chains.txt");
  for (const storage::Chain& chain : table.chains()) {
    CHECK(chain.version == 1);
    for (const storage::Replica& r : chain.replicas) CHECK(r.state == ReplicaState::serving);
  }
  CHECK(table.serverName(1) == "127.0.0.1:9102");
  CHECK(table.serverIndexOf("127.0.0.1:9103") == 2u);
  CHECK_FALSE(table.serverIndexOf("nobody"));
  CHECK(table.chainVersionOfTarget(31) == 1u);
  CHECK_FALSE(table.chainVersionOfTarget(99));
}

TEST_CASE("Records round trip: a table, its records, their JSON, and back, equal", "[routing]") {
  const storage::ChainTable table = *storage::ChainTable::parse(kTable, "chains.txt");
  storage::RoutingRecords records = table.records();
  REQUIRE(records.servers.size() == 3);
  CHECK(records.servers[0].targets == std::vector<std::uint32_t>{11, 12});
  CHECK(records.dataset.chains == std::vector<std::uint32_t>{1, 2, 3});
  records.chains[0] = storage::markTargetOffline(records.chains[0], 11);
  storage::RoutingRecords parsed;
  const auto dataset = storage::parseDatasetRecord(storage::toJson(records.dataset));
  REQUIRE(dataset);
  parsed.dataset = *dataset;
  for (const storage::ServerRecord& s : records.servers) {
    const auto server = storage::parseServerRecord(storage::toJson(s));
    REQUIRE(server);
    parsed.servers.push_back(*server);
  }
  for (const ChainRecord& c : records.chains) {
    const auto chain = storage::parseChainRecord(storage::toJson(c));
    REQUIRE(chain);
    parsed.chains.push_back(*chain);
  }
  CHECK(parsed == records);
  std::string why;
  const coio::Result<storage::ChainTable> assembled = storage::ChainTable::assemble(parsed, &why);
  INFO(why);
  REQUIRE(assembled);
  CHECK(assembled->records() == records);
  CHECK(assembled->chains()[0].version == 2);
  CHECK(assembled->chains()[0].replicas.back().targetId == 11);
  CHECK(assembled->chains()[0].replicas.back().state == ReplicaState::offline);
  CHECK(assembled->withChain(records.chains[0]).value() == *assembled);
}

TEST_CASE("The JSON is canonical: the documented members, in order, no spaces", "[routing]") {
  CHECK(storage::toJson(storage::markTargetOffline(threeTargets(), 21)) ==
        R"({"id":1,"version":8,"targets":[{"id":11,"server":"a","state":"serving"},)"
        R"({"id":33,"server":"c","state":"serving"},{"id":21,"server":"b","state":"offline"}]})");
  const storage::ServerRecord server{"a", *coio::SocketAddress::parse("[::1]:9101"), {11, 12}};
  CHECK(storage::toJson(server) == R"({"name":"a","address":"[::1]:9101","targets":[11,12]})");
  CHECK(storage::toJson(storage::DatasetRecord{6000, 65536, {1, 2, 3}}) ==
        R"({"chunks":6000,"chunk_size":65536,"chains":[1,2,3]})");
  CHECK(storage::datasetKey() == "/coio/dataset");
  CHECK(storage::serverKey("a") == "/coio/servers/a");
  CHECK(storage::chainKey(7) == "/coio/chains/7");
  // Any member order and whitespace parse to the same record.
  const auto reordered = storage::parseChainRecord(
      R"( { "targets" : [ { "state":"offline", "server":"b", "id":21 } ], "version" : 2, "id" : 5 } )");
  REQUIRE(reordered);
  CHECK(*reordered == ChainRecord{5, 2, {{21, "b", ReplicaState::offline}}});
}

TEST_CASE("Malformed JSON records are rejected with a message that says what and where", "[routing]") {
  const auto chain = [](const std::string& text, std::string* why) { return storage::parseChainRecord(text, why); };
  const auto server = [](const std::string& text, std::string* why) { return storage::parseServerRecord(text, why); };
  const auto dataset = [](const std::string& text, std::string* why) { return storage::parseDatasetRecord(text, why); };
  CHECK(rejection(chain, R"({"id":1,"version":1,"targets":[)") == "not JSON");
  CHECK(rejection(chain, "[1,2]") == "chain: expected an object");
  CHECK(rejection(chain, R"({"id":1,"targets":[]})") == "chain: no \"version\"");
  CHECK(rejection(chain, R"({"id":-1,"version":1,"targets":[]})") ==
        "chain.id: expected a whole number from 0 to 4294967295");
  CHECK(rejection(chain, R"({"id":4294967296,"version":1,"targets":[]})") ==
        "chain.id: expected a whole number from 0 to 4294967295");
  CHECK(rejection(chain, R"({"id":1.5,"version":1,"targets":[]})") ==
        "chain.id: expected a whole number from 0 to 4294967295");
  CHECK(rejection(chain, R"({"id":1,"version":1,"targets":{}})") == "chain.targets: expected an array");
  CHECK(rejection(chain, R"({"id":1,"version":1,"targets":[],"extra":0})") ==
        "chain: unknown members (expected exactly the documented ones)");
  CHECK(rejection(chain, R"({"id":1,"version":1,"targets":[{"id":2,"server":"a","state":"syncing"}]})") ==
        "chain.targets[0].state: \"syncing\" is not \"serving\" or \"offline\"");
  CHECK(rejection(chain, R"({"id":1,"version":1,"targets":[{"id":2,"server":3,"state":"serving"}]})") ==
        "chain.targets[0].server: expected a string");
  CHECK(rejection(server, R"({"name":"a","address":"localhost:1","targets":[]})") ==
        "server.address: \"localhost:1\" is not HOST:PORT (e.g. 127.0.0.1:9001 or [::1]:9001)");
  CHECK(rejection(server, R"({"name":"a","address":"127.0.0.1:1","targets":[1,"2"]})") ==
        "server.targets[1]: expected a whole number from 0 to 4294967295");
  CHECK(rejection(dataset, R"({"chunks":10,"chains":[1]})") == "dataset: no \"chunk_size\"");
}

TEST_CASE("assemble() checks the table's rules on records", "[routing]") {
  const storage::RoutingRecords good = storage::ChainTable::parse(kTable, "chains.txt")->records();
  const auto rejected = [](const storage::RoutingRecords& records) {
    std::string why;
    const coio::Result<storage::ChainTable> table = storage::ChainTable::assemble(records, &why);
    REQUIRE_FALSE(table);
    return why;
  };
  storage::RoutingRecords r = good;
  r.chains[1].targets[0].server = "127.0.0.1:9103";  // target 22 on 9103, beside 31
  CHECK(rejected(r) == "chain 2: target 22 is not listed by its server \"127.0.0.1:9103\"");
  r = good;
  r.chains[1].targets[0].server = "nobody";
  CHECK(rejected(r) == "chain 2: target 22 is on an unknown server \"nobody\"");
  r = good;
  r.chains.pop_back();
  CHECK(rejected(r) == "chain 3 has no record");
  r = good;
  r.dataset.chains.pop_back();
  CHECK(rejected(r) == "chain 3 is not in the dataset's list of chains");
  r = good;
  r.chains[0].targets.clear();
  CHECK(rejected(r) == "chain 1 has no target: a chain needs at least one");
  r = good;
  r.chains[0].targets[1].state = ReplicaState::offline;  // 21 offline before 33 serving
  CHECK(rejected(r) == "chain 1: serving target 33 after an offline one: offline targets come last");
  r = good;
  r.servers[1].name = r.servers[0].name;
  CHECK(rejected(r) == "server \"127.0.0.1:9101\" given twice");
  r = good;
  r.dataset.chunks = 2;
  CHECK(rejected(r) == "chunks 2 is fewer than the 3 chains: a chain would hold no chunk");
  r = good;
  r.dataset.chunkSize = 1000;
  CHECK(rejected(r) == "chunk size 1000: expected a multiple of 4K up to 2G");
  std::string why;
  CHECK_FALSE(storage::ChainTable::parse(kTable, "chains.txt")->withChain(ChainRecord{9, 1, {}}, &why));
  CHECK(why == "chain 9 is not in the table");
}

TEST_CASE("The cluster status table shows servers, targets, chains with states and versions", "[routing]") {
  storage::ChainTable table = *storage::ChainTable::parse(kTable, "chains.txt");
  table = *table.withChain(storage::markTargetOffline(table.chainRecord(1), 22));
  table = *table.withChain(storage::markTargetOffline(table.chainRecord(1), 31));
  const std::string status = storage::clusterStatus(table);
  INFO(status);
  CHECK(status.find("dataset: 6000 chunks of 65536 bytes on 3 chains (1 with no serving target)") == 0);
  CHECK(status.find("127.0.0.1:9101  127.0.0.1:9101  11 12") != std::string::npos);
  CHECK(status.find("22      2      127.0.0.1:9102  offline") != std::string::npos);
  CHECK(status.find("1      1        11 (serving) 21 (serving) 33 (serving)") != std::string::npos);
  CHECK(status.find("2      3        22 (offline) 31 (offline)  NO SERVING TARGET") != std::string::npos);
}
