// The one main() of every test executable (Catch2 v2 or v3, see support/catch.hpp).
#if PROMPTCACHE_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>

int main(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
#else
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif

// The checkout's paths (tests/support/test_support.hpp): only this unit is compiled with them.
namespace promptcache::test {
const char* source_dir_path() {
  return PROMPTCACHE_SOURCE_DIR;
}
const char* shared_dir_path() {
  return PROMPTCACHE_SHARED_DIR;
}
}  // namespace promptcache::test
