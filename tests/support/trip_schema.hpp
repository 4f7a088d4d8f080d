// The small travel schema the engine and batch tests share: a preamble, a module, a union of two,
// a cache="false" module and a module with a parameter.
#pragma once

namespace promptcache::test {

inline constexpr const char* kTripSchema = R"(<schema name="trip">
  Plan a trip.
  <module name="city">The city has a river and a big park.</module>
  <union scaffold="sunny">
    <module name="sunny">The weather is warm and sunny.</module>
    <module name="rainy">It will rain in the evening, take a map and an umbrella.</module>
  </union>
  <module name="live" cache="false">Today is a new day.</module>
  <module name="who">The guide is <parameter name="guide" length="4" scaffold="Tom"/> today.</module>
</schema>)";

}  // namespace promptcache::test
