// KVCache slots held by reference to a stored block (append_block): the runs segments() hands the
// fused attention, the buffer views that copy them in first, and truncate / keep_rows / clear
// keeping them right. Each check compares against a cache whose slots were copied (write_block).
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/kv_cache.hpp"

using namespace promptcache;

namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kDim = 8;

KVCache make(int64_t capacity, int64_t batch = 1) {
  return KVCache({kLayers, batch, kHeads, kDim, capacity}, torch::TensorOptions());
}

torch::Tensor block(int64_t n) {
  return torch::randn({kLayers, 2, kHeads, n, kDim});
}

std::vector<int64_t> range(int64_t begin, int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(begin + i);
  return out;
}

// Slots [0, count) of one layer, read through segments(), joined along the slot axis.
std::pair<torch::Tensor, torch::Tensor> joined(const KVCache& cache, int64_t layer, int64_t count) {
  std::vector<torch::Tensor> k, v;
  for (const auto& s : cache.segments(layer, count)) {
    k.push_back(s.keys.expand({cache.shape().batch, kHeads, s.slots(), kDim}));
    v.push_back(s.values.expand({cache.shape().batch, kHeads, s.slots(), kDim}));
  }
  return {torch::cat(k, 2), torch::cat(v, 2)};
}

}  // namespace

TEST_CASE("KV cache slots held by reference read like copied ones", "[kv_cache]") {
  torch::manual_seed(5);
  const auto a = block(5), b = block(3), fresh = torch::randn({1, kHeads, 2, kDim});
  // held: a and b by reference, then two fresh tokens written as a forward does.
  // copied: the same states copied into the buffer.
  KVCache held = make(16), copied = make(16);
  held.append_block(a, range(10, 5));
  held.append_block(b, range(40, 3));
  copied.write_block(0, a);
  copied.write_block(5, b);
  copied.fill_external(8, [] {
    auto p = range(10, 5);
    for (int64_t x : range(40, 3)) p.push_back(x);
    return p;
  }());
  for (KVCache* c : {&held, &copied}) {
    for (int64_t l = 0; l < kLayers; ++l) {
      auto [k, v] = c->pending_slots(l, 2);
      k.copy_(fresh * (l + 1));
      v.copy_(fresh * (l + 2));
    }
    c->commit({50, 51});
  }
  CHECK(held.block_slots() == 8);
  CHECK(copied.block_slots() == 0);
  CHECK(held.positions() == copied.positions());
  CHECK(held.max_position() == 51);

  // The runs: a, b (shared by every batch row), then the buffer's two fresh slots.
  const auto runs = held.segments(1, 10);
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].slots() == 5);
  CHECK(runs[0].keys.size(0) == 1);
  CHECK(runs[0].keys.data_ptr<float>() == a[1][0].data_ptr<float>());  // in place, not a copy
  CHECK(runs[1].slots() == 3);
  CHECK(runs[2].slots() == 2);
  // Fewer slots than held: the run they end in is cut short.
  const auto first6 = held.segments(0, 6);
  REQUIRE(first6.size() == 2);
  CHECK(first6[1].slots() == 1);
  for (int64_t l = 0; l < kLayers; ++l) {
    auto [k, v] = joined(held, l, 10);
    CHECK(torch::equal(k, copied.keys(l)));
    CHECK(torch::equal(v, copied.values(l)));
  }
  CHECK(held.block_slots() == 8);  // segments() copies nothing

  // A buffer view copies the held runs in: afterwards the buffer itself holds the states.
  CHECK(torch::equal(held.keys(1), copied.keys(1)));
  CHECK(held.block_slots() == 0);
  CHECK(held.segments(1, 10).size() == 1);
  CHECK(torch::equal(held.values(0), copied.values(0)));
}

TEST_CASE("KV cache held slots survive truncate, reserve and keep_rows", "[kv_cache]") {
  torch::manual_seed(6);
  const auto a = block(6), b = block(4);
  KVCache held = make(12, 3), copied = make(12, 3);
  held.append_block(a, range(0, 6));
  held.append_block(b, range(20, 4));
  copied.write_block(0, a);
  copied.write_block(6, b);
  copied.fill_external(10, held.positions());

  // A cut through b keeps its first slot by reference; a cut through a drops b.
  held.truncate(7);
  copied.truncate(7);
  CHECK(held.block_slots() == 7);
  CHECK(held.segments(0, 7).back().slots() == 1);
  auto [k7, v7] = joined(held, 0, 7);
  CHECK(torch::equal(k7, copied.keys(0)));

  // A token of each batch row's own after them, in the buffer.
  const auto own = torch::randn({3, kHeads, 1, kDim});
  for (KVCache* c : {&held, &copied}) {
    for (int64_t l = 0; l < kLayers; ++l) c->write_pending(l, own * (l + 1), own * (l + 2));
    c->commit({30});
  }

  // Growing the buffer keeps the references (and the slots' meaning) and the buffer's slots.
  held.reserve(40);
  CHECK(held.capacity() == 40);
  CHECK(held.block_slots() == 7);
  auto [kr, vr] = joined(held, 1, 8);
  CHECK(torch::equal(vr, copied.values(1)));

  // Dropping batch rows: held runs serve every row, so they stay as they are; each row's own
  // slots move.
  held.keep_rows({0, 2});
  copied.keep_rows({0, 2});
  CHECK(held.shape().batch == 2);
  CHECK(held.block_slots() == 7);
  auto [kk, vk] = joined(held, 1, 8);
  CHECK(torch::equal(kk, copied.keys(1)));
  CHECK(torch::equal(kk.narrow(2, 7, 1)[1], own[2] * 2));

  held.truncate(3);
  CHECK(held.block_slots() == 3);
  held.clear();
  CHECK(held.block_slots() == 0);
  CHECK(held.segments(0, 0).empty());
}

TEST_CASE("KV cache block writes and references check their blocks", "[kv_cache]") {
  KVCache cache = make(8);
  CHECK_THROWS_WITH(cache.append_block(torch::randn({kLayers, 2, kHeads + 1, 2, kDim}), {0, 1}),
                    Catch::Contains("append_block") && Catch::Contains("dense"));
  CHECK_THROWS_WITH(cache.append_block(block(2).to(torch::kFloat64), {0, 1}),
                    Catch::Contains("dtype"));
  CHECK_THROWS_WITH(cache.append_block(block(3), {0, 1}), Catch::Contains("append_block"));
  CHECK_THROWS_AS(cache.append_block(block(9), range(0, 9)), Error);  // beyond the capacity
  CHECK_THROWS_WITH(cache.write_block(0, torch::randn({kLayers, 2, kHeads, 2, kDim + 1})),
                    Catch::Contains("write_block"));
  CHECK_THROWS_WITH(cache.write_block(7, block(2)), Catch::Contains("outside"));
  CHECK_THROWS_WITH(cache.segments(kLayers, 1), Catch::Contains("segments"));
  CHECK(cache.length() == 0);
  CHECK(cache.block_slots() == 0);
  // A write over a held run replaces it: the run is copied in first, then overwritten.
  const auto a = block(4), b = block(2);
  cache.append_block(a, range(0, 4));
  cache.write_block(1, b);
  CHECK(cache.block_slots() == 0);
  CHECK(torch::equal(cache.keys(0).narrow(2, 0, 1), a[0][0].narrow(1, 0, 1).unsqueeze(0)));
  CHECK(torch::equal(cache.keys(0).narrow(2, 1, 2), b[0][0].unsqueeze(0)));
}

TEST_CASE("KV cache add_rows keeps the rows it has and adds empty, usable ones", "[kv_cache]") {
  torch::manual_seed(7);
  // Two rows with their own states and positions in 5 of 8 slots.
  KVCache cache = make(8, 2);
  const auto a = block(5), b = block(5);
  cache.write_block(0, a, 0);
  cache.write_block(0, b, 1);
  cache.fill_external(5, range(0, 5));
  cache.set_row_positions(1, 0, range(10, 5));
  const auto before = cache.all_slots(0, 5).clone();

  // Beyond the rows allocated: the buffer grows and the filled slots are copied over.
  cache.add_rows(1);
  CHECK(cache.shape().batch == 3);
  CHECK(cache.length() == 5);
  CHECK(cache.capacity() == 8);
  CHECK(torch::equal(cache.all_slots(0, 5).narrow(2, 0, 2), before));
  CHECK(cache.row_positions(0) == range(0, 5));
  CHECK(cache.row_positions(1) == range(10, 5));
  CHECK(cache.row_positions(2) == std::vector<int64_t>(5, -1));
  CHECK(cache.positions() == range(0, 5));

  // The new row takes states and positions of its own; then every row appends a token, as a
  // batched decode step does.
  const auto c = block(5);
  cache.write_block(0, c, 2);
  cache.set_row_positions(2, 0, range(20, 5));
  const auto token = torch::randn({3, kHeads, 1, kDim});
  for (int64_t l = 0; l < kLayers; ++l) cache.write_pending(l, token * (l + 1), token * (l + 2));
  cache.commit({5});
  CHECK(torch::equal(cache.all_slots(0, 5).narrow(2, 0, 2), before));
  CHECK(torch::equal(cache.all_slots(0, 5).select(2, 2), c));
  for (int64_t l = 0; l < kLayers; ++l) {
    CHECK(torch::equal(cache.keys(l).narrow(2, 5, 1), token * (l + 1)));
    CHECK(torch::equal(cache.values(l).narrow(2, 5, 1), token * (l + 2)));
  }
  auto positions = range(20, 5);
  positions.push_back(5);
  CHECK(cache.row_positions(2) == positions);
  CHECK(cache.row_positions(0) == range(0, 6));

  // Rows keep_rows dropped are taken back without allocating; the kept rows stay bit-identical
  // and the taken-back ones hold no states (position -1).
  cache.keep_rows({0, 2});
  const auto kept = cache.all_slots(0, 6).clone();
  const void* buffer = cache.all_slots(0, 1).data_ptr();
  cache.add_rows(2);
  CHECK(cache.shape().batch == 4);
  CHECK(cache.all_slots(0, 1).data_ptr() == buffer);
  CHECK(torch::equal(cache.all_slots(0, 6).narrow(2, 0, 2), kept));
  CHECK(cache.row_positions(1) == positions);
  CHECK(cache.row_positions(2) == std::vector<int64_t>(6, -1));
  CHECK(cache.row_positions(3) == std::vector<int64_t>(6, -1));
  cache.write_block(0, block(6), 3);
  cache.set_row_positions(3, 0, range(30, 6));
  CHECK(cache.row_positions(3) == range(30, 6));
  CHECK(torch::equal(cache.all_slots(0, 6).narrow(2, 0, 2), kept));

  // Bad arguments are refused, naming the call, and change nothing.
  CHECK_THROWS_WITH(cache.add_rows(0),
                    Catch::Contains("add_rows") && Catch::Contains("positive, got 0"));
  CHECK_THROWS_WITH(cache.add_rows(-2), Catch::Contains("add_rows") && Catch::Contains("-2"));
  CHECK_THROWS_AS(cache.add_rows(0), Error);
  CHECK(cache.shape().batch == 4);
  CHECK(cache.length() == 6);
  KVCache unallocated;
  CHECK_THROWS_WITH(unallocated.add_rows(1),
                    Catch::Contains("add_rows") && Catch::Contains("no buffer"));
  CHECK(unallocated.shape().batch == 1);
}

TEST_CASE("KV cache growth keeps held runs by reference and dropped rows for add_rows",
          "[kv_cache]") {
  torch::manual_seed(8);
  // Three rows: 4 slots held by reference, then one token of each row's own in the buffer.
  KVCache cache = make(6, 3);
  const auto a = block(4);
  cache.append_block(a, range(0, 4));
  const auto own = torch::randn({3, kHeads, 1, kDim});
  for (int64_t l = 0; l < kLayers; ++l) cache.write_pending(l, own * (l + 1), own * (l + 2));
  cache.commit({10});
  // Row r of the expected keys of layer l: a's keys, then own[rows[r]] * (l + 1).
  const auto expected_keys = [&](int64_t l, const std::vector<int64_t>& rows) {
    std::vector<torch::Tensor> out;
    for (int64_t r : rows) {
      out.push_back(torch::cat({a[l][0].unsqueeze(0), (own[r] * (l + 1)).unsqueeze(0)}, 2));
    }
    return torch::cat(out, 0);
  };

  // Two rows dropped, then the slots grown: the rows keep_rows let go stay allocated.
  cache.keep_rows({0, 2});
  cache.reserve(16);
  CHECK(cache.capacity() == 16);
  CHECK(cache.shape().batch == 2);
  CHECK(cache.block_slots() == 4);  // still by reference: reserve copied only the buffer's slots
  const void* buffer = cache.all_slots(4, 1).data_ptr();
  cache.add_rows(1);  // taken back: no new buffer
  CHECK(cache.all_slots(4, 1).data_ptr() == buffer);
  CHECK(cache.shape().batch == 3);
  CHECK(cache.block_slots() == 4);
  for (int64_t l = 0; l < kLayers; ++l) {
    auto [k, v] = joined(cache, l, 5);
    CHECK(torch::equal(k.narrow(0, 0, 2), expected_keys(l, {0, 2})));
  }
  CHECK(cache.row_positions(2) == std::vector<int64_t>(5, -1));

  // Beyond the rows allocated: a new buffer of twice the rows, the capacity kept, the held run
  // still by reference and the buffer's slots of the old rows copied over.
  cache.add_rows(2);
  CHECK(cache.shape().batch == 5);
  CHECK(cache.capacity() == 16);
  CHECK(cache.all_slots(4, 1).data_ptr() != buffer);
  CHECK(cache.block_slots() == 4);
  for (int64_t l = 0; l < kLayers; ++l) {
    auto [k, v] = joined(cache, l, 5);
    CHECK(k.size(0) == 5);
    CHECK(torch::equal(k.narrow(0, 0, 2), expected_keys(l, {0, 2})));
    CHECK(torch::equal(cache.keys(l).narrow(0, 0, 2), expected_keys(l, {0, 2})));
  }
  // And it writes and reads at its new width.
  const auto token = torch::randn({5, kHeads, 1, kDim});
  for (int64_t l = 0; l < kLayers; ++l) cache.write_pending(l, token * (l + 1), token * (l + 2));
  cache.commit({11});
  CHECK(cache.length() == 6);
  CHECK(torch::equal(cache.values(1).narrow(2, 5, 1), token * 3));
}
