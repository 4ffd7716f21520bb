// Writes the seed corpus: one valid frame of each type (the fuzzer mutates
// from there). Run by CMake when the fuzzer is built, output committed.
#include "protocol/protocol.hpp"

#include <fstream>
#include <string>
#include <vector>

using namespace storage::proto;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  auto write = [&](const char* name, const std::vector<std::byte>& frame) {
    std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(frame.data()),
                                                            static_cast<std::streamsize>(frame.size()));
  };
  std::vector<std::byte> f;
  BatchReadRequest req{ChecksumMode::crc32c, true,
                       {{1, 0, 4096, {}, 0, 0}, {2, 512, 100, {0x7f0000001000, 4096, 77}, 0x10203, 7}}};
  encode(f, 1, req);
  write("batch_read_request", f);
  f.clear();
  encode(f, 2, BatchReadResponse{{{IoStatus::ok, 4096, 0x1234}, {IoStatus::chunkNotFound, 0, 0},
                                  {IoStatus::targetNotFound, 0, 0}, {IoStatus::staleRouting, 0, 0},
                                  {IoStatus::corrupt, 0, 0}}});
  write("batch_read_response", f);
  f.clear();
  encode(f, 3, ErrorFrame{ProtocolErrc::unknownType, "unknown message type 9"});
  write("error", f);
  f.clear();
  encodeEmpty(f, MessageType::transmitGrant, 4);
  write("transmit_grant", f);
  f.clear();
  encode(f, 5, IoData{1, 4096, 65536});
  write("io_data", f);
}
