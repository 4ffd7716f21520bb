#pragma once
// The canonical JSON of the routing records (CHAINS.md, "Routing in a
// cluster manager"): one chain, one server, the dataset, each the value of
// one key of a cluster manager (etcd). nlohmann-json, for the example only:
// the coio library does not depend on it.
#include "cluster/chain_table.hpp"

#include <coio/core/result.hpp>
#include <coio/net/socket_address.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace storage {

namespace detail {

// Reads object `j`'s members, each exactly once and nothing else; the
// first problem is kept in `why` (what, and where: "chain.targets[1].id").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string where, std::string& why) : j_(j), where_(std::move(where)), why_(why) {
    if (!j_.is_object()) fail(where_ + ": expected an object");
  }

  bool ok() const noexcept { return why_.empty(); }
  void fail(std::string what) {
    if (why_.empty()) why_ = std::move(what);
  }
  const std::string& where() const noexcept { return where_; }

  // The member `name`, if present (else a failure); counted for exact().
  const nlohmann::json* member(const char* name) {
    if (!ok()) return nullptr;
    const auto found = j_.find(name);
    if (found == j_.end()) {
      fail(where_ + ": no \"" + name + "\"");
      return nullptr;
    }
    ++used_;
    return &*found;
  }

  template <typename T>
  T unsignedMember(const char* name, std::uint64_t max) {
    const nlohmann::json* m = member(name);
    if (m == nullptr) return 0;
    return unsignedValue<T>(*m, where_ + "." + name, max);
  }

  template <typename T>
  T unsignedValue(const nlohmann::json& v, const std::string& at, std::uint64_t max) {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > max) {
      fail(at + ": expected a whole number from 0 to " + std::to_string(max));
      return 0;
    }
    return static_cast<T>(v.get<std::uint64_t>());
  }

  std::string stringMember(const char* name) {
    const nlohmann::json* m = member(name);
    if (m == nullptr) return {};
    if (!m->is_string()) {
      fail(where_ + "." + name + ": expected a string");
      return {};
    }
    return m->get<std::string>();
  }

  const nlohmann::json* arrayMember(const char* name) {
    const nlohmann::json* m = member(name);
    if (m != nullptr && !m->is_array()) {
      fail(where_ + "." + name + ": expected an array");
      return nullptr;
    }
    return m;
  }

  // No member beyond those read.
  void exact() {
    if (ok() && used_ != j_.size()) fail(where_ + ": unknown members (expected exactly the documented ones)");
  }

 private:
  const nlohmann::json& j_;
  std::string where_;
  std::string& why_;
  std::size_t used_ = 0;
};

template <typename T, typename Read>
coio::Result<T> parseJson(std::string_view text, std::string* why, Read read) {
  std::string message;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  T value{};
  if (j.is_discarded()) {
    message = "not JSON";
  } else {
    read(j, value, message);
  }
  if (message.empty()) return value;
  if (why != nullptr) *why = std::move(message);
  return coio::Errc::invalidArgument;
}

}  // namespace detail

/// The key of the dataset record in a cluster manager: `/coio/dataset`.
inline std::string datasetKey() { return "/coio/dataset"; }
/// The key of server `name`'s record: `/coio/servers/<name>`.
inline std::string serverKey(std::string_view name) { return "/coio/servers/" + std::string(name); }
/// The key of chain `id`'s record: `/coio/chains/<id>`.
inline std::string chainKey(std::uint32_t id) { return "/coio/chains/" + std::to_string(id); }

/// `{"id":1,"version":3,"targets":[{"id":11,"server":"a","state":"serving"}]}`:
/// members in this order, no spaces (the same record, the same text).
inline std::string toJson(const ChainRecord& chain) {
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (const TargetRecord& t : chain.targets) {
    targets.push_back({{"id", t.id}, {"server", t.server}, {"state", toString(t.state)}});
  }
  return nlohmann::ordered_json{{"id", chain.id}, {"version", chain.version}, {"targets", std::move(targets)}}.dump();
}

/// `{"name":"a","address":"127.0.0.1:9101","targets":[11,12]}`.
inline std::string toJson(const ServerRecord& server) {
  return nlohmann::ordered_json{
      {"name", server.name}, {"address", server.address.toString()}, {"targets", server.targets}}.dump();
}

/// `{"chunks":6000,"chunk_size":65536,"chains":[1,2,3]}`.
inline std::string toJson(const DatasetRecord& dataset) {
  return nlohmann::ordered_json{
      {"chunks", dataset.chunks}, {"chunk_size", dataset.chunkSize}, {"chains", dataset.chains}}.dump();
}

/// Parses toJson(ChainRecord)'s form (members in any order, whitespace
/// allowed). Errors: Errc::invalidArgument, `why` saying what and where
/// (not JSON, a member missing, unknown or of the wrong type, a number out
/// of range, a state other than "serving" or "offline"). The chain's rules
/// are ChainTable::assemble()'s to check.
inline coio::Result<ChainRecord> parseChainRecord(std::string_view text, std::string* why = nullptr) {
  return detail::parseJson<ChainRecord>(text, why, [](const nlohmann::json& j, ChainRecord& chain, std::string& message) {
    detail::JsonFields fields(j, "chain", message);
    chain.id = fields.unsignedMember<std::uint32_t>("id", UINT32_MAX);
    chain.version = fields.unsignedMember<std::uint32_t>("version", UINT32_MAX);
    const nlohmann::json* targets = fields.arrayMember("targets");
    fields.exact();
    if (targets == nullptr || !fields.ok()) return;
    for (std::size_t i = 0; i < targets->size() && fields.ok(); ++i) {
      detail::JsonFields target((*targets)[i], "chain.targets[" + std::to_string(i) + "]", message);
      TargetRecord t;
      t.id = target.unsignedMember<std::uint32_t>("id", UINT32_MAX);
      t.server = target.stringMember("server");
      const std::string state = target.stringMember("state");
      target.exact();
      if (!target.ok()) return;
      if (state == "offline") {
        t.state = ReplicaState::offline;
      } else if (state != "serving") {
        target.fail(target.where() + ".state: \"" + state + "\" is not \"serving\" or \"offline\"");
        return;
      }
      chain.targets.push_back(std::move(t));
    }
  });
}

/// Parses toJson(ServerRecord)'s form; errors as parseChainRecord (and an
/// address that is not HOST:PORT).
inline coio::Result<ServerRecord> parseServerRecord(std::string_view text, std::string* why = nullptr) {
  return detail::parseJson<ServerRecord>(text, why, [](const nlohmann::json& j, ServerRecord& server,
                                                       std::string& message) {
    detail::JsonFields fields(j, "server", message);
    server.name = fields.stringMember("name");
    const std::string address = fields.stringMember("address");
    const nlohmann::json* targets = fields.arrayMember("targets");
    fields.exact();
    if (!fields.ok()) return;
    coio::Result<coio::SocketAddress> parsed = coio::SocketAddress::parse(address);
    if (!parsed) {
      fields.fail("server.address: \"" + address + "\" is not HOST:PORT (e.g. 127.0.0.1:9001 or [::1]:9001)");
      return;
    }
    server.address = *parsed;
    for (std::size_t i = 0; i < targets->size() && fields.ok(); ++i) {
      server.targets.push_back(
          fields.unsignedValue<std::uint32_t>((*targets)[i], "server.targets[" + std::to_string(i) + "]", UINT32_MAX));
    }
  });
}

/// Parses toJson(DatasetRecord)'s form; errors as parseChainRecord.
inline coio::Result<DatasetRecord> parseDatasetRecord(std::string_view text, std::string* why = nullptr) {
  return detail::parseJson<DatasetRecord>(text, why, [](const nlohmann::json& j, DatasetRecord& dataset,
                                                        std::string& message) {
    detail::JsonFields fields(j, "dataset", message);
    dataset.chunks = fields.unsignedMember<std::uint64_t>("chunks", UINT64_MAX);
    dataset.chunkSize = fields.unsignedMember<std::uint32_t>("chunk_size", UINT32_MAX);
    const nlohmann::json* chains = fields.arrayMember("chains");
    fields.exact();
    if (!fields.ok()) return;
    for (std::size_t i = 0; i < chains->size() && fields.ok(); ++i) {
      dataset.chains.push_back(
          fields.unsignedValue<std::uint32_t>((*chains)[i], "dataset.chains[" + std::to_string(i) + "]", UINT32_MAX));
    }
  });
}

}  // namespace storage
