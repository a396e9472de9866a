// ToValidUtf8: what a completion's text looks like when a byte-level model
// stops in the middle of a multi-byte character.

#include <catch2/catch.hpp>
#include <string>

#include "common/tokenizer/utf8.h"

namespace tandem::tokenizer {
namespace {

TEST_CASE("ToValidUtf8 keeps valid text and replaces broken sequences",
          "[tokenizer][utf8]") {
  const std::string valid = "a+b=7 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80";
  CHECK(ToValidUtf8(valid) == valid);
  CHECK(ToValidUtf8("") == "");
  // "你" cut after two of its three bytes, at the end of a completion.
  CHECK(ToValidUtf8("ok \xE4\xBD") == "ok \xEF\xBF\xBD\xEF\xBF\xBD");
  // A stray continuation byte and an overlong encoding of '/'.
  CHECK(ToValidUtf8("x\x80y") == "x\xEF\xBF\xBDy");
  CHECK(ToValidUtf8("\xC0\xAF") == "\xEF\xBF\xBD\xEF\xBF\xBD");
  // Surrogates are not valid UTF-8.
  CHECK(ToValidUtf8("\xED\xA0\x80") ==
        "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace tandem::tokenizer
