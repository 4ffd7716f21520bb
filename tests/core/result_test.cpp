#include <coio/core/result.hpp>
#include "test_helpers.hpp"

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <system_error>

using coio::Errc;
using coio::Result;

TEST_CASE("Result holds a value or an error", "[result]") {
  Result<int> ok = 5;
  CHECK(ok.hasValue());
  CHECK(static_cast<bool>(ok));
  CHECK(*ok == 5);
  CHECK_FALSE(ok.error());

  Result<int> bad = std::make_error_code(std::errc::timed_out);
  CHECK_FALSE(bad);
  CHECK(bad.error() == std::errc::timed_out);
  CHECK(bad.valueOr(-1) == -1);
  CHECK(ok.valueOr(-1) == 5);
}

TEST_CASE("Reading the value of a failed Result throws system_error with the code", "[result]") {
  Result<std::string> bad = Errc::eof;
  std::error_code thrown;
  try {
    (void)bad.value();
  } catch (const std::system_error& e) {
    thrown = e.code();
  }
  CHECK(thrown == Errc::eof);
  Result<void> badVoid = std::errc::connection_reset;
  CHECK_THROWS_AS(badVoid.value(), std::system_error);
  Result<void> okVoid;
  CHECK(okVoid.hasValue());
  CHECK_NOTHROW(okVoid.value());
}

TEST_CASE("Result supports move-only values", "[result]") {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(3);
  std::unique_ptr<int> p = std::move(r).value();
  CHECK(*p == 3);
}

TEST_CASE("coio error codes have a category and clear messages", "[result]") {
  std::error_code ec = Errc::eof;
  CHECK(ec.category() == coio::coioCategory());
  CHECK(std::string(ec.category().name()) == "coio");
  CHECK(ec.message().find("end of stream") != std::string::npos);
  CHECK(std::error_code(Errc::closed).message().find("closed") != std::string::npos);
  CHECK(coio::systemError(ECONNREFUSED) == std::errc::connection_refused);
  CHECK(ec != std::errc::timed_out);
}

TEST_CASE("Result asserts on an error_code that holds no error", "[result]") {
  CHECK(coio::test::abortsInChild([] { Result<int> r{std::error_code()}; }));
}
