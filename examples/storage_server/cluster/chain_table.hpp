#pragma once
// The chain table (CHAINS.md is the normative text): the servers of a
// cluster, their targets grouped into chains of replicas, which chain holds
// a chunk, and each chain's version and its targets' states: a cluster's
// routing. Loading it enforces 3FS's rules, each violation an error that
// names its line; assemble() builds one from per-key records (an etcd
// watch's), and markTargetOffline/markTargetServing are 3FS's rules for a
// chain's changes.
#include "cluster/numbers.hpp"
#include "store/chunk_store.hpp"

#include <coio/core/result.hpp>
#include <coio/net/socket_address.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace storage {

/// Whether a replica is read. 3FS has two more states, syncing and
/// waiting, for a replica that catches up on writes it missed; coio's
/// chunks are immutable and identical on every replica, so a target that
/// comes back has nothing to catch up on and serves at once (CHAINS.md).
enum class ReplicaState : std::uint8_t {
  serving,  ///< read by clients
  offline,  ///< not read: its server failed (or was taken out)
};

/// "serving" or "offline".
inline const char* toString(ReplicaState state) noexcept {
  return state == ReplicaState::serving ? "serving" : "offline";
}

/// One copy of a chain's chunks: a target on a server.
struct Replica {
  std::size_t server = 0;     ///< index into ChainTable::servers()
  std::uint32_t targetId = 0;
  ReplicaState state = ReplicaState::serving;
  friend bool operator==(const Replica&, const Replica&) = default;
};

/// An ordered list of replicas holding the same chunks, byte for byte.
struct Chain {
  std::uint32_t id = 0;
  /// Goes up by one with every change of the chain (markTargetOffline,
  /// markTargetServing); 1 for a chain read from a file.
  std::uint32_t version = 1;
  std::vector<Replica> replicas;  ///< at least one, each on a different server; offline ones last
};

/// One target of a ChainRecord: its server by name.
struct TargetRecord {
  std::uint32_t id = 0;
  std::string server;
  ReplicaState state = ReplicaState::serving;
  friend bool operator==(const TargetRecord&, const TargetRecord&) = default;
};

/// One chain as a cluster manager stores it (one per key, /coio/chains/<id>):
/// a plain value, its servers named (cluster/routing_json.hpp serializes it).
struct ChainRecord {
  std::uint32_t id = 0;
  std::uint32_t version = 1;
  std::vector<TargetRecord> targets;
  friend bool operator==(const ChainRecord&, const ChainRecord&) = default;
};

/// One server as a cluster manager stores it (/coio/servers/<name>).
struct ServerRecord {
  std::string name;
  coio::SocketAddress address;
  std::vector<std::uint32_t> targets;  ///< the targets it serves
  friend bool operator==(const ServerRecord&, const ServerRecord&) = default;
};

/// The dataset's shape and the order of its chains (chunk c is on chain
/// `chains[c mod chains.size()]`), stored once (/coio/dataset).
struct DatasetRecord {
  std::uint64_t chunks = 0;
  std::uint32_t chunkSize = 0;
  std::vector<std::uint32_t> chains;  ///< chain ids, in the table's order
  friend bool operator==(const DatasetRecord&, const DatasetRecord&) = default;
};

/// Everything a ChainTable holds, as records (ChainTable::records(), assemble()).
struct RoutingRecords {
  DatasetRecord dataset;
  std::vector<ServerRecord> servers;
  std::vector<ChainRecord> chains;
  friend bool operator==(const RoutingRecords&, const RoutingRecords&) = default;
};

namespace detail {

// Takes target `targetId` out of `chain` if it is there in a state other
// than `state`, with its state set to `state`.
inline std::optional<TargetRecord> takeForChange(ChainRecord& chain, std::uint32_t targetId, ReplicaState state) {
  const auto found = std::find_if(chain.targets.begin(), chain.targets.end(),
                                  [&](const TargetRecord& t) { return t.id == targetId; });
  if (found == chain.targets.end() || found->state == state) return std::nullopt;
  TargetRecord target = *found;
  target.state = state;
  chain.targets.erase(found);
  return target;
}

}  // namespace detail

/// 3FS's rule for a target that failed: it moves to the end of its chain,
/// offline, and the chain's version goes up by one. A target already
/// offline, or not in the chain, changes nothing (the version stays).
inline ChainRecord markTargetOffline(ChainRecord chain, std::uint32_t targetId) {
  std::optional<TargetRecord> target = detail::takeForChange(chain, targetId, ReplicaState::offline);
  if (!target) return chain;
  chain.targets.push_back(std::move(*target));
  ++chain.version;
  return chain;
}

/// 3FS's rule for a target that is back: it serves again behind the
/// targets that kept serving (and ahead of those still offline: offline
/// targets stay last), and the chain's version goes up by one. A target
/// already serving, or not in the chain, changes nothing.
inline ChainRecord markTargetServing(ChainRecord chain, std::uint32_t targetId) {
  std::optional<TargetRecord> target = detail::takeForChange(chain, targetId, ReplicaState::serving);
  if (!target) return chain;
  const auto firstOffline = std::find_if(chain.targets.begin(), chain.targets.end(),
                                         [](const TargetRecord& t) { return t.state == ReplicaState::offline; });
  chain.targets.insert(firstOffline, std::move(*target));
  ++chain.version;
  return chain;
}

/// A parsed, checked chain table, the routing of a cluster: a plain value.
///
/// Guarantees (what load()/parse() and assemble() enforce, 3FS's rules):
/// - every chain has at least one target (at most kMaxReplicas), and its targets are on
///   different servers (a server that fails takes at most one replica of
///   a chain with it);
/// - a target belongs to at most one chain (target ids are unique in the
///   table); a server may hold many targets of different chains (several
///   targets per disk spread a failed server's reads over many survivors);
/// - chunk `c` is held by chain `chains()[c % chains().size()]`, and every
///   chain holds at least one chunk;
/// - a chain's offline targets come after its serving ones (a chain may
///   have no serving target: its chunks cannot be read); a file's table
///   has every chain at version 1 and every target serving.
class ChainTable {
 public:
  /// At most this many targets in one chain.
  static constexpr std::size_t kMaxReplicas = 32;

  /// Parses the text of a chain table. Errors: Errc::invalidArgument, with
  /// `why` (if given) set to "NAME:LINE: what is wrong" (`name`: the
  /// file's, for the message).
  static coio::Result<ChainTable> parse(std::string_view text, std::string_view name, std::string* why = nullptr) {
    Parser parser(name);
    coio::Result<ChainTable> table = parser.run(text);
    if (!table && why != nullptr) *why = parser.message();
    return table;
  }

  /// Reads and parses the file `path` (errors as parse(); a file that
  /// cannot be read: its errno, `why` saying so).
  static coio::Result<ChainTable> load(const std::string& path, std::string* why = nullptr) {
    std::ifstream in(path);
    if (!in) {
      if (why != nullptr) *why = path + ": cannot read the chain table";
      return std::make_error_code(std::errc::no_such_file_or_directory);
    }
    std::ostringstream text;
    text << in.rdbuf();
    return parse(text.str(), path, why);
  }

  /// How many chunks the dataset has (ids 0 .. chunks() - 1).
  std::uint64_t chunks() const noexcept { return chunks_; }
  /// Every chunk's size in bytes.
  std::uint32_t chunkSize() const noexcept { return chunkSize_; }
  /// Builds a table from records (a cluster manager's keys), checking the
  /// same rules as parse() (chain order: `records.dataset.chains`), and
  /// that every chain of that list has one record, and no other; that
  /// server names and addresses are unique; and that a chain's target is
  /// on a server that lists it. Errors: Errc::invalidArgument, `why` (if
  /// given) saying what is wrong.
  static coio::Result<ChainTable> assemble(const RoutingRecords& records, std::string* why = nullptr) {
    std::string message;
    coio::Result<ChainTable> table = assembleChecked(records, message);
    if (!table && why != nullptr) *why = std::move(message);
    return table;
  }

  /// The table as records: assemble(records()) is an equal table. A
  /// server read from a file is named by its address ("127.0.0.1:9101").
  RoutingRecords records() const {
    RoutingRecords out{{chunks_, chunkSize_, {}}, {}, {}};
    for (std::size_t s = 0; s < servers_.size(); ++s) out.servers.push_back({serverNames_[s], servers_[s], {}});
    for (std::size_t c = 0; c < chains_.size(); ++c) {
      out.dataset.chains.push_back(chains_[c].id);
      out.chains.push_back(chainRecord(c));
      for (const Replica& r : chains_[c].replicas) out.servers[r.server].targets.push_back(r.targetId);
    }
    return out;
  }

  /// The chain at `index` of chains() as a record.
  ChainRecord chainRecord(std::size_t index) const {
    const Chain& chain = chains_.at(index);
    ChainRecord record{chain.id, chain.version, {}};
    for (const Replica& r : chain.replicas) record.targets.push_back({r.targetId, serverNames_[r.server], r.state});
    return record;
  }

  /// This table with the chain of `chain.id` replaced by `chain` (errors as
  /// assemble(); a chain id not in the table is one).
  coio::Result<ChainTable> withChain(const ChainRecord& chain, std::string* why = nullptr) const {
    RoutingRecords all = records();
    const auto found = std::find_if(all.chains.begin(), all.chains.end(),
                                    [&](const ChainRecord& c) { return c.id == chain.id; });
    if (found == all.chains.end()) {
      if (why != nullptr) *why = "chain " + std::to_string(chain.id) + " is not in the table";
      return coio::Errc::invalidArgument;
    }
    *found = chain;
    return assemble(all, why);
  }

  /// The servers, in order of first mention (a file) or of the records.
  const std::vector<coio::SocketAddress>& servers() const noexcept { return servers_; }
  /// The name of server `server` (an index into servers()).
  const std::string& serverName(std::size_t server) const { return serverNames_.at(server); }
  /// The position in servers() of the server named `name`.
  std::optional<std::size_t> serverIndexOf(std::string_view name) const noexcept {
    const auto found = std::find(serverNames_.begin(), serverNames_.end(), name);
    if (found == serverNames_.end()) return std::nullopt;
    return static_cast<std::size_t>(found - serverNames_.begin());
  }
  /// The chains, in the table's order.
  const std::vector<Chain>& chains() const noexcept { return chains_; }
  /// The position in chains() of the chain that holds chunk `chunkId`.
  std::size_t chainIndexOf(std::uint64_t chunkId) const noexcept { return chunkId % chains_.size(); }
  /// The position in chains() of the chain target `targetId` belongs to.
  std::optional<std::size_t> chainIndexOfTarget(std::uint32_t targetId) const noexcept {
    for (std::size_t c = 0; c < chains_.size(); ++c) {
      for (const Replica& r : chains_[c].replicas) {
        if (r.targetId == targetId) return c;
      }
    }
    return std::nullopt;
  }
  /// The chunk store target `targetId` keeps (its chain's chunks, at
  /// `chunksPerFile` per data file), for createChunkStore; nullopt if the
  /// table has no such target.
  std::optional<ChunkStoreLayout> targetLayout(std::uint32_t targetId, std::uint32_t chunksPerFile) const {
    const std::optional<std::size_t> chain = chainIndexOfTarget(targetId);
    if (!chain) return std::nullopt;
    const std::uint64_t stride = chains_.size();
    return ChunkStoreLayout{(chunks_ - *chain + stride - 1) / stride, chunkSize_, chunksPerFile, *chain, stride};
  }
  /// The version of the chain target `targetId` belongs to; nullopt if none.
  std::optional<std::uint32_t> chainVersionOfTarget(std::uint32_t targetId) const noexcept {
    const std::optional<std::size_t> chain = chainIndexOfTarget(targetId);
    if (!chain) return std::nullopt;
    return chains_[*chain].version;
  }

  friend bool operator==(const ChainTable& a, const ChainTable& b) { return a.records() == b.records(); }

 private:
  // Reads the table line by line; the first error stops it (message()).
  class Parser {
   public:
    explicit Parser(std::string_view name) : name_(name) {}

    coio::Result<ChainTable> run(std::string_view text) {
      std::size_t line = 0;
      bool header = false;
      while (!text.empty()) {
        const std::size_t end = text.find('\n');
        std::string_view content = text.substr(0, end);
        text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
        ++line;
        content = content.substr(0, content.find('#'));
        const std::vector<std::string_view> words = split(content);
        if (words.empty()) continue;
        bool ok = false;
        if (!header) {
          ok = words.size() == 2 && words[0] == "coio-chains" && words[1] == "1";
          if (!ok) fail(line, "expected the header line \"coio-chains 1\" first");
          header = ok;
        } else if (words[0] == "chunks") {
          ok = setOnce(line, words, chunksLine_, "\"chunks N\", 1 <= N <= 2^40", [&](std::string_view v) {
            const std::optional<std::uint64_t> n = parseCount(v);
            if (!n || !goodChunks(*n)) return false;
            chunks_ = *n;
            return true;
          });
        } else if (words[0] == "chunk-size") {
          const char* expected = "\"chunk-size S\", a multiple of 4K up to 2G (suffixes K, M, G)";
          ok = setOnce(line, words, chunkSizeLine_, expected, [&](std::string_view v) {
            const std::optional<std::uint64_t> n = parseSize(v);
            if (!n || !goodChunkSize(*n)) return false;
            chunkSize_ = static_cast<std::uint32_t>(*n);
            return true;
          });
        } else if (words[0] == "chain") {
          ok = addChain(line, words);
        } else {
          fail(line, "unknown keyword \"" + std::string(words[0]) + "\" (expected chunks, chunk-size or chain)");
        }
        if (!ok) return coio::Errc::invalidArgument;
      }
      if (!header) {
        return failed(std::max<std::size_t>(line, 1), "empty table: expected the header line \"coio-chains 1\"");
      }
      if (chunksLine_ == 0) return failed(line, "no \"chunks N\" line: how many chunks the dataset has");
      if (chunkSizeLine_ == 0) return failed(line, "no \"chunk-size S\" line: how large a chunk is");
      if (chains_.empty()) return failed(line, "no chain: at least one \"chain ID HOST:PORT/TARGET...\" line");
      if (chunks_ < chains_.size()) {
        return failed(chunksLine_, "chunks " + std::to_string(chunks_) + " is fewer than the " +
                                       std::to_string(chains_.size()) + " chains: a chain would hold no chunk");
      }
      ChainTable table;
      table.chunks_ = chunks_;
      table.chunkSize_ = chunkSize_;
      for (const coio::SocketAddress& address : servers_) table.serverNames_.push_back(address.toString());
      table.servers_ = std::move(servers_);
      table.chains_ = std::move(chains_);
      return table;
    }

    const std::string& message() const noexcept { return message_; }

   private:
    static std::vector<std::string_view> split(std::string_view s) {
      std::vector<std::string_view> words;
      std::size_t at = 0;
      while (at < s.size()) {
        const std::size_t begin = s.find_first_not_of(" \t\r", at);
        if (begin == std::string_view::npos) break;
        const std::size_t end = std::min(s.find_first_of(" \t\r", begin), s.size());
        words.push_back(s.substr(begin, end - begin));
        at = end;
      }
      return words;
    }

    void fail(std::size_t line, const std::string& what) {
      message_ = std::string(name_) + ':' + std::to_string(line) + ": " + what;
    }
    coio::Errc failed(std::size_t line, const std::string& what) {
      fail(line, what);
      return coio::Errc::invalidArgument;
    }

    // "KEY VALUE", once; `set` checks and stores the value, `expected`
    // says what a good line looks like.
    template <typename Set>
    bool setOnce(std::size_t line, const std::vector<std::string_view>& words, std::size_t& seenAt,
                 const std::string& expected, Set set) {
      if (seenAt != 0) {
        fail(line, std::string(words[0]) + " given twice (first on line " + std::to_string(seenAt) + ")");
        return false;
      }
      if (words.size() != 2 || !set(words[1])) {
        fail(line, "expected " + expected);
        return false;
      }
      seenAt = line;
      return true;
    }

    // "chain ID HOST:PORT/TARGET..."
    bool addChain(std::size_t line, const std::vector<std::string_view>& words) {
      const std::optional<std::uint64_t> id = words.size() >= 2 ? parseCount(words[1]) : std::nullopt;
      if (!id || *id > UINT32_MAX) {
        fail(line, "expected \"chain ID HOST:PORT/TARGET...\" with a numeric chain id");
        return false;
      }
      const auto chainId = static_cast<std::uint32_t>(*id);
      if (const auto seen = chainLines_.find(chainId); seen != chainLines_.end()) {
        fail(line, "chain " + std::to_string(chainId) + " defined twice (first on line " +
                       std::to_string(seen->second) + ")");
        return false;
      }
      if (words.size() == 2) {
        fail(line, "chain " + std::to_string(chainId) + " has no target: a chain needs at least one");
        return false;
      }
      if (words.size() - 2 > kMaxReplicas) {
        fail(line, "chain " + std::to_string(chainId) + " has " + std::to_string(words.size() - 2) +
                       " targets: at most " + std::to_string(kMaxReplicas));
        return false;
      }
      Chain chain{chainId, 1, {}};
      for (std::size_t w = 2; w < words.size(); ++w) {
        const std::optional<Replica> replica = parseReplica(line, words[w]);
        if (!replica) return false;
        if (const auto seen = targetLines_.find(replica->targetId); seen != targetLines_.end()) {
          fail(line, "target " + std::to_string(replica->targetId) + " is already in chain " +
                         std::to_string(seen->second.first) + " (line " + std::to_string(seen->second.second) +
                         "): a target belongs to at most one chain");
          return false;
        }
        for (const Replica& other : chain.replicas) {
          if (other.server == replica->server) {
            fail(line, "chain " + std::to_string(chainId) + " has targets " + std::to_string(other.targetId) +
                           " and " + std::to_string(replica->targetId) + " on the same server " +
                           servers_[other.server].toString() +
                           ": a chain's targets must be on different servers");
            return false;
          }
        }
        targetLines_.emplace(replica->targetId, std::pair{chainId, line});
        chain.replicas.push_back(*replica);
      }
      chainLines_.emplace(chainId, line);
      chains_.push_back(std::move(chain));
      return true;
    }

    // "HOST:PORT/TARGET", the server added to the table's list if new.
    std::optional<Replica> parseReplica(std::size_t line, std::string_view word) {
      const std::size_t slash = word.rfind('/');
      const std::optional<std::uint64_t> target =
          slash == std::string_view::npos ? std::nullopt : parseCount(word.substr(slash + 1));
      coio::Result<coio::SocketAddress> address = coio::Errc::invalidArgument;
      if (target) address = coio::SocketAddress::parse(word.substr(0, slash));
      if (!target || *target > UINT32_MAX || !address) {
        fail(line, "\"" + std::string(word) + "\" is not HOST:PORT/TARGET (e.g. 127.0.0.1:9001/3 or [::1]:9001/3)");
        return std::nullopt;
      }
      auto& servers = servers_;
      const std::size_t server =
          static_cast<std::size_t>(std::find(servers.begin(), servers.end(), *address) - servers.begin());
      if (server == servers.size()) servers.push_back(*address);
      return Replica{server, static_cast<std::uint32_t>(*target)};
    }

    std::string_view name_;
    std::string message_;
    std::uint64_t chunks_ = 0;
    std::uint32_t chunkSize_ = 0;
    std::vector<coio::SocketAddress> servers_;
    std::vector<Chain> chains_;
    std::size_t chunksLine_ = 0, chunkSizeLine_ = 0;
    std::unordered_map<std::uint32_t, std::size_t> chainLines_;                          // chain id -> line
    std::unordered_map<std::uint32_t, std::pair<std::uint32_t, std::size_t>> targetLines_;  // target -> chain, line
  };

  static bool goodChunks(std::uint64_t n) noexcept { return n != 0 && n <= (std::uint64_t{1} << 40); }
  static bool goodChunkSize(std::uint64_t n) noexcept { return n != 0 && n % 4096 == 0 && n <= (std::uint64_t{1} << 31); }

  static coio::Result<ChainTable> assembleChecked(const RoutingRecords& records, std::string& why) {
    const auto fail = [&why](std::string what) {
      why = std::move(what);
      return coio::Errc::invalidArgument;
    };
    const DatasetRecord& dataset = records.dataset;
    if (!goodChunks(dataset.chunks)) return fail("chunks " + std::to_string(dataset.chunks) + ": expected 1 to 2^40");
    if (!goodChunkSize(dataset.chunkSize)) {
      return fail("chunk size " + std::to_string(dataset.chunkSize) + ": expected a multiple of 4K up to 2G");
    }
    if (dataset.chains.empty()) return fail("no chain: the dataset lists none");
    if (dataset.chunks < dataset.chains.size()) {
      return fail("chunks " + std::to_string(dataset.chunks) + " is fewer than the " +
                  std::to_string(dataset.chains.size()) + " chains: a chain would hold no chunk");
    }
    ChainTable table;
    table.chunks_ = dataset.chunks;
    table.chunkSize_ = dataset.chunkSize;
    std::unordered_map<std::uint32_t, std::size_t> targetServer;  // target -> the server that lists it
    for (const ServerRecord& server : records.servers) {
      if (server.name.empty()) return fail("a server has an empty name");
      if (table.serverIndexOf(server.name)) return fail("server \"" + server.name + "\" given twice");
      if (std::find(table.servers_.begin(), table.servers_.end(), server.address) != table.servers_.end()) {
        return fail("server \"" + server.name + "\" has the address " + server.address.toString() +
                    " of another server");
      }
      for (std::uint32_t target : server.targets) {
        if (!targetServer.emplace(target, table.servers_.size()).second) {
          return fail("target " + std::to_string(target) + " is listed by two servers");
        }
      }
      table.serverNames_.push_back(server.name);
      table.servers_.push_back(server.address);
    }
    std::unordered_map<std::uint32_t, std::uint32_t> targetChain;  // target -> its chain
    for (std::uint32_t id : dataset.chains) {
      const auto count = std::count_if(records.chains.begin(), records.chains.end(),
                                       [id](const ChainRecord& c) { return c.id == id; });
      if (count != 1) {
        return fail("chain " + std::to_string(id) + (count == 0 ? " has no record" : " has several records"));
      }
      if (std::count(dataset.chains.begin(), dataset.chains.end(), id) != 1) {
        return fail("chain " + std::to_string(id) + " is listed twice in the dataset");
      }
      const ChainRecord& record =
          *std::find_if(records.chains.begin(), records.chains.end(), [id](const ChainRecord& c) { return c.id == id; });
      const std::string name = "chain " + std::to_string(id);
      if (record.targets.empty()) return fail(name + " has no target: a chain needs at least one");
      if (record.targets.size() > kMaxReplicas) {
        return fail(name + " has " + std::to_string(record.targets.size()) + " targets: at most " +
                    std::to_string(kMaxReplicas));
      }
      Chain chain{id, record.version, {}};
      for (const TargetRecord& t : record.targets) {
        const std::string target = "target " + std::to_string(t.id);
        const std::optional<std::size_t> server = table.serverIndexOf(t.server);
        if (!server) return fail(name + ": " + target + " is on an unknown server \"" + t.server + "\"");
        const auto listed = targetServer.find(t.id);
        if (listed == targetServer.end() || listed->second != *server) {
          return fail(name + ": " + target + " is not listed by its server \"" + t.server + "\"");
        }
        if (const auto seen = targetChain.find(t.id); seen != targetChain.end()) {
          return fail(name + ": " + target + " is already in chain " + std::to_string(seen->second) +
                      ": a target belongs to at most one chain");
        }
        for (const Replica& other : chain.replicas) {
          if (other.server == *server) {
            return fail(name + " has targets " + std::to_string(other.targetId) + " and " + std::to_string(t.id) +
                        " on the same server \"" + t.server + "\": a chain's targets must be on different servers");
          }
        }
        if (!chain.replicas.empty() && chain.replicas.back().state == ReplicaState::offline &&
            t.state == ReplicaState::serving) {
          return fail(name + ": serving " + target + " after an offline one: offline targets come last");
        }
        targetChain.emplace(t.id, id);
        chain.replicas.push_back({*server, t.id, t.state});
      }
      table.chains_.push_back(std::move(chain));
    }
    for (const ChainRecord& record : records.chains) {
      if (std::find(dataset.chains.begin(), dataset.chains.end(), record.id) == dataset.chains.end()) {
        return fail("chain " + std::to_string(record.id) + " is not in the dataset's list of chains");
      }
    }
    return table;
  }

  std::uint64_t chunks_ = 0;
  std::uint32_t chunkSize_ = 0;
  std::vector<coio::SocketAddress> servers_;
  std::vector<std::string> serverNames_;  // per server; a file's: its address
  std::vector<Chain> chains_;
};

}  // namespace storage
