// Where fuzz_replay finds the saved inputs (tests/fuzz): the checkout's absolute path is compiled
// into this unit alone, so replay.cpp compiles the same in every checkout and ccache hits it in a
// fresh clone (CCACHE_BASEDIR rewrites the paths of a command line, never a -D value's).
namespace promptcache::fuzz {

const char* replay_dir() {
  return PROMPTCACHE_FUZZ_DIR;
}

}  // namespace promptcache::fuzz
