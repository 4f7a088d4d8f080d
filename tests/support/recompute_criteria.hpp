// Every recompute criterion (promptcache/recompute.hpp), for tests that must hold under each.
#pragma once

#include <vector>

#include "promptcache/recompute.hpp"

namespace promptcache::test {

inline const std::vector<RecomputeCriterion>& all_recompute_criteria() {
  static const std::vector<RecomputeCriterion> all = {
      RecomputeCriterion::kDeviation,       RecomputeCriterion::kBoundary,
      RecomputeCriterion::kRecent,          RecomputeCriterion::kAttention,
      RecomputeCriterion::kImpact,          RecomputeCriterion::kFirstK,
      RecomputeCriterion::kFirstKDeviation, RecomputeCriterion::kFirstKImpact,
      RecomputeCriterion::kGradual,         RecomputeCriterion::kImpactExact,
      RecomputeCriterion::kImpactLookahead};
  return all;
}

}  // namespace promptcache::test
