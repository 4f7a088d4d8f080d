// Catch2 for the tests, whichever major version the system has: v2 (Debian bookworm, one
// header) or v3 (Debian trixie, Ubuntu 24.04 and later: a compiled library). The tests are
// written against v2's names; v3 moved the string matchers and Approx, so they are brought back
// here under the v2 names. tests/CMakeLists.txt defines PROMPTCACHE_CATCH2_MAJOR from the
// Catch2 package it found.
#pragma once

#if PROMPTCACHE_CATCH2_MAJOR >= 3
#include <catch2/catch_all.hpp>

#include <string>

using Catch::Approx;
namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& text) {
  return Matchers::ContainsSubstring(text);
}
inline Matchers::StartsWithMatcher StartsWith(const std::string& text) {
  return Matchers::StartsWith(text);
}
}  // namespace Catch
#else
#include <catch2/catch.hpp>
#endif
