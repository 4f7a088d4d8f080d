// The object that carries the LibTorch test suites' shared precompiled header
// (tests/CMakeLists.txt, promptcache_test_pch); it has no code of its own.
