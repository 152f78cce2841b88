// Hex coding of the binary handles that travel through the store
// (common/hex.h): a round trip of every byte value, and malformed strings
// refused, never half-read or thrown as a std:: parse error.
#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "check.h"
#include "common/error.h"
#include "common/hex.h"
#include "transport/tcp_listener.h"

using namespace smdccl;

TEST(hex_round_trips_every_byte) {
  unsigned char bytes[256];
  for (int i = 0; i < 256; ++i) bytes[i] = static_cast<unsigned char>(i);
  const std::string s = toHex(bytes, sizeof bytes);
  CHECK(s.size() == 512);
  CHECK(s.substr(0, 6) == "000102");
  CHECK(s.substr(506) == "fdfeff");
  unsigned char back[256] = {};
  CHECK(fromHex(s, back, sizeof back));
  CHECK(std::memcmp(back, bytes, sizeof bytes) == 0);
  CHECK(toHex(bytes, 0).empty());
  CHECK(fromHex("", back, 0));
}

TEST(hex_refuses_malformed_strings) {
  unsigned char b[2] = {};
  CHECK(fromHex("0aff", b, 2) && b[0] == 0x0a && b[1] == 0xff);
  CHECK(!fromHex("0af", b, 2));    // too short
  CHECK(!fromHex("0aff0", b, 2));  // too long
  CHECK(!fromHex("0AFF", b, 2));   // uppercase: never written
  CHECK(!fromHex("0g00", b, 2));
  CHECK(!fromHex("00 0", b, 2));
}

TEST(hex_group_token_malformed_is_a_protocol_error) {
  GroupToken t{};
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(17 * i + 3);
  CHECK(tokenFromHex(tokenToHex(t)) == t);
  // std::stoi used to throw std::invalid_argument on these.
  CHECK_THROWS(tokenFromHex(std::string(32, 'z')), CommError);
  CHECK_THROWS(tokenFromHex("12"), CommError);
}
