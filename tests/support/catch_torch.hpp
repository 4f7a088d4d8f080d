// Include this instead of <catch2/catch.hpp> in tests that use LibTorch: LibTorch pulls in glog,
// whose CHECK macro would silently replace Catch's CHECK (an abort instead of a counted
// assertion). Loading glog first and dropping its CHECK keeps Catch's.
#pragma once

#include <torch/types.h>
#undef CHECK
#include "support/catch.hpp"
