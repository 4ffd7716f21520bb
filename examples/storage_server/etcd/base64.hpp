#pragma once
// Base64 (RFC 4648, standard alphabet, padded): how etcd's JSON gateway
// carries keys and values (protobuf `bytes`).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace storage::etcd {

/// `bytes` as padded base64.
inline std::string base64Encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    std::uint32_t group = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      group = group << 8 | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (std::size_t k = 0; k < 4; ++k) {
      out.push_back(k <= n ? kAlphabet[(group >> (18 - 6 * k)) & 63] : '=');
    }
  }
  return out;
}

/// The bytes `text` encodes; nullopt unless it is padded base64 of the
/// standard alphabet (length a multiple of 4, `=` only at the end).
inline std::optional<std::string> base64Decode(std::string_view text) {
  static constexpr std::array<std::int8_t, 256> kValue = [] {
    std::array<std::int8_t, 256> v{};
    v.fill(-1);
    constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (std::size_t i = 0; i < alphabet.size(); ++i) {
      v[static_cast<unsigned char>(alphabet[i])] = static_cast<std::int8_t>(i);
    }
    return v;
  }();
  if (text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const std::size_t pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    std::uint32_t group = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      const std::int8_t v = k < 4 - pad ? kValue[static_cast<unsigned char>(text[i + k])] : 0;
      if (v < 0) return std::nullopt;
      group = group << 6 | static_cast<std::uint32_t>(v);
    }
    for (std::size_t k = 0; k < 3 - pad; ++k) out.push_back(static_cast<char>((group >> (16 - 8 * k)) & 0xff));
  }
  return out;
}

}  // namespace storage::etcd
