// GGML's block-quantized weights (promptcache/model/ggml_quant.hpp, quant_linear.hpp): the type
// table, hand-built blocks of each format decoded as GGML defines them, quantize's error bounds,
// and the integer kernels (scalar, AVX2, AVX-512 VNNI) equal to each other bitwise and to the f32
// product of x rounded to 8 bits with the dequantized weights; linear_layer takes such weights
// under every kernel selection.
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/quant_linear.hpp"
#include "promptcache/model/threads.hpp"
#include "support/cpu_kernels.hpp"
#include "support/ggml_blocks.hpp"

using namespace promptcache;
using ggml::Type;

namespace {

constexpr Type kBlockTypes[] = {Type::Q4_0, Type::Q5_0, Type::Q5_1, Type::Q8_0,
                                Type::Q4_K, Type::Q5_K, Type::Q6_K};

void put_f16(uint8_t* p, float v) {
  const auto h = torch::tensor({v}).to(torch::kFloat16).contiguous();
  std::memcpy(p, h.data_ptr(), 2);
}

torch::Tensor one_block(Type t, const std::vector<uint8_t>& bytes) {
  auto q = torch::zeros({1, 1, ggml::block_bytes(t)}, torch::kUInt8);
  std::memcpy(q.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return q;
}

// x rounded as the integer kernels round it: per block of `block` values, d = max |x| / 127 and
// x = nearbyint(x * (1 / d)) * d (the same f32 operations).
torch::Tensor rounded_x(const torch::Tensor& x, int64_t block) {
  auto c = x.contiguous().clone();
  float* p = c.data_ptr<float>();
  for (int64_t b0 = 0; b0 < c.numel(); b0 += block) {
    float amax = 0;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(p[b0 + i]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int64_t i = 0; i < block; ++i) p[b0 + i] = std::nearbyint(p[b0 + i] * id) * d;
  }
  return c;
}

int64_t x_block(Type t) {
  return ggml::block_elements(t) == 32 ? 32 : 256;
}

}  // namespace

TEST_CASE("ggml type table has GGML's ids, names and block sizes", "[ggml_quant]") {
  struct Row {
    uint32_t id;
    const char* name;
    int64_t elements, bytes;
  };
  const Row rows[] = {{0, "F32", 1, 4},       {1, "F16", 1, 2},       {2, "Q4_0", 32, 18},
                      {6, "Q5_0", 32, 22},    {7, "Q5_1", 32, 24},    {8, "Q8_0", 32, 34},
                      {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210},
                      {30, "BF16", 1, 2}};
  for (const auto& r : rows) {
    const auto t = ggml::type_from_id(r.id);
    REQUIRE(t.has_value());
    CHECK(ggml::type_name(*t) == r.name);
    CHECK(ggml::block_elements(*t) == r.elements);
    CHECK(ggml::block_bytes(*t) == r.bytes);
  }
  for (uint32_t unknown : {3u, 9u, 10u, 11u, 15u, 29u, 1000u}) {
    CHECK_FALSE(ggml::type_from_id(unknown).has_value());
  }
  CHECK(ggml::quant_type_of(torch::zeros({4, 2, 144}, torch::kUInt8)) == Type::Q4_K);
  CHECK(ggml::quant_type_of(torch::zeros({4, 2, 210}, torch::kUInt8)) == Type::Q6_K);
  CHECK(ggml::quant_type_of(torch::zeros({4, 2, 22}, torch::kUInt8)) == Type::Q5_0);
  CHECK(ggml::quant_type_of(torch::zeros({4, 2, 24}, torch::kUInt8)) == Type::Q5_1);
  CHECK_FALSE(ggml::quant_type_of(torch::zeros({4, 2, 144}, torch::kInt8)).has_value());
  CHECK_FALSE(ggml::quant_type_of(torch::zeros({4, 288}, torch::kUInt8)).has_value());
  CHECK_FALSE(ggml::quant_type_of(torch::zeros({4, 2, 100}, torch::kUInt8)).has_value());
}

TEST_CASE("ggml dequantize decodes hand-built blocks of every format", "[ggml_quant]") {
  SECTION("Q4_0: d * (nibble - 8), low nibbles first") {
    std::vector<uint8_t> b(18);
    put_f16(b.data(), 0.5f);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    const auto y = ggml::dequantize(one_block(Type::Q4_0, b)).flatten();
    for (int j = 0; j < 16; ++j) {
      CHECK(y[j].item<float>() == 0.5f * static_cast<float>(j - 8));
      CHECK(y[j + 16].item<float>() == 0.5f * static_cast<float>(7 - j));
    }
  }
  SECTION("Q8_0: d * int8") {
    std::vector<uint8_t> b(34);
    put_f16(b.data(), 0.25f);
    for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j * 8 - 128));
    const auto y = ggml::dequantize(one_block(Type::Q8_0, b)).flatten();
    for (int j = 0; j < 32; ++j)
      CHECK(y[j].item<float>() == 0.25f * static_cast<float>(j * 8 - 128));
  }
  SECTION("Q5_0 and Q5_1: nibbles plus bit j of qh as value j's fifth bit") {
    for (bool one : {false, true}) {
      const Type t = one ? Type::Q5_1 : Type::Q5_0;
      std::vector<uint8_t> b(static_cast<std::size_t>(ggml::block_bytes(t)));
      put_f16(b.data(), 0.5f);
      if (one) put_f16(b.data() + 2, -3.0f);
      uint8_t* qh = b.data() + (one ? 4 : 2);
      uint8_t* qs = qh + 4;
      for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
      // qh as a little-endian u32: bits 1, 9 (value 9's high bit, byte 1), 16 and 31.
      qh[0] = 1 << 1;
      qh[1] = 1 << 1;
      qh[2] = 1;
      qh[3] = 1 << 7;
      const auto y = ggml::dequantize(one_block(t, b)).flatten();
      for (int j = 0; j < 32; ++j) {
        const int nibble = j < 16 ? j : 15 - (j - 16);
        const bool high = j == 1 || j == 9 || j == 16 || j == 31;
        const int q = nibble + (high ? 16 : 0);
        CAPTURE(one, j);
        CHECK(y[j].item<float>() ==
              (one ? 0.5f * static_cast<float>(q) - 3.0f : 0.5f * static_cast<float>(q - 16)));
      }
    }
  }
  SECTION("Q4_K and Q5_K: packed 6-bit scales and mins, sub-block pairs share bytes") {
    for (bool five : {false, true}) {
      const Type t = five ? Type::Q5_K : Type::Q4_K;
      std::vector<uint8_t> b(static_cast<std::size_t>(ggml::block_bytes(t)));
      put_f16(b.data(), 2.0f);
      put_f16(b.data() + 2, 0.5f);
      uint8_t* sc = b.data() + 4;
      // Sub-block 1: scale 5, min 9 (low 6 bits in bytes 1 and 5). Sub-block 6: scale 37
      // (0b100101: low four in byte 10's low nibble, top two in byte 2's top bits), min 50
      // (0b110010: byte 10's high nibble, byte 6's top bits).
      sc[1] = 5;
      sc[5] = 9;
      sc[10] = static_cast<uint8_t>((37 & 0xF) | ((50 & 0xF) << 4));
      sc[2] |= static_cast<uint8_t>((37 >> 4) << 6);
      sc[6] |= static_cast<uint8_t>((50 >> 4) << 6);
      uint8_t* qs = b.data() + (five ? 48 : 16);
      qs[0 * 32 + 3] = 0x70;         // sub-block 1 (high nibble of pair 0), value 3: 7
      qs[3 * 32 + 4] = 0x0B;         // sub-block 6 (low nibble of pair 3), value 4: 11
      if (five) b[16 + 4] = 1 << 6;  // sub-block 6's value 4 gets 16 more: 27
      const auto y = ggml::dequantize(one_block(t, b)).flatten();
      CHECK(y[32 + 3].item<float>() == 2.0f * 5 * 7 - 0.5f * 9);
      CHECK(y[32 + 4].item<float>() == -0.5f * 9);
      CHECK(y[192 + 4].item<float>() == 2.0f * 37 * (five ? 27 : 11) - 0.5f * 50);
      CHECK(y[0].item<float>() == 0.0f);  // sub-block 0: scale 0, min 0
    }
  }
  SECTION("Q6_K: ql nibbles, qh bit pairs, int8 scales per 16") {
    std::vector<uint8_t> b(210);
    put_f16(b.data() + 208, 0.125f);
    auto* sc = reinterpret_cast<int8_t*>(b.data() + 192);
    for (int g = 0; g < 16; ++g) sc[g] = static_cast<int8_t>(g - 8);
    // Position 128 + 64 + 5 (second half, group 2, l = 5): high nibble of ql[64 + 5], bits 4-5
    // of qh[32 + 5]; q = 0x9 | (2 << 4) = 41 -> 9.
    b[64 + 5] = 0x90;
    b[128 + 32 + 5] = 2 << 4;
    // Position 32 + 7 (first half, group 1): low nibble of ql[32 + 7], bits 2-3 of qh[7];
    // q = 3 | (1 << 4) = 19 -> -13.
    b[32 + 7] = 0x03;
    b[128 + 7] = 1 << 2;
    const auto y = ggml::dequantize(one_block(Type::Q6_K, b)).flatten();
    const int p1 = 128 + 64 + 5, p2 = 32 + 7;
    CHECK(y[p1].item<float>() == 0.125f * static_cast<float>(p1 / 16 - 8) * 9.0f);
    CHECK(y[p2].item<float>() == 0.125f * static_cast<float>(p2 / 16 - 8) * -13.0f);
    CHECK(y[0].item<float>() == 0.125f * -8.0f * -32.0f);  // every other value is q = 0 -> -32
  }
}

TEST_CASE("ggml quantize stays within each type's stated error bound", "[ggml_quant]") {
  // RMS relative error of quantize + dequantize on N(0, 1) rows (docs/architecture.md states
  // these bounds; measured values are printed).
  struct Bound {
    Type t;
    double rms;
  };
  const Bound bounds[] = {{Type::Q8_0, 0.006}, {Type::Q6_K, 0.02}, {Type::Q5_K, 0.04},
                          {Type::Q5_1, 0.045}, {Type::Q5_0, 0.05}, {Type::Q4_K, 0.08},
                          {Type::Q4_0, 0.095}};
  torch::manual_seed(7);
  const auto w = torch::randn({64, 1024});
  for (const auto& b : bounds) {
    const auto q = ggml::quantize(w, b.t);
    REQUIRE(q.sizes() ==
            torch::IntArrayRef({64, 1024 / ggml::block_elements(b.t), ggml::block_bytes(b.t)}));
    REQUIRE(ggml::quant_type_of(q) == b.t);
    const auto back = ggml::dequantize(q);
    const double rms = ((back - w).pow(2).mean() / w.pow(2).mean()).sqrt().item<double>();
    WARN(ggml::type_name(b.t) << " RMS relative error " << rms << " (bound " << b.rms << ")");
    CHECK(rms < b.rms);
    // Any float dtype in, the same blocks as from its f32 values.
    CHECK(torch::equal(ggml::quantize(w.to(torch::kFloat64), b.t), q));
  }
  // A zero row and a constant row come back exactly.
  auto flat = torch::zeros({2, 256});
  flat[1].fill_(0.75);
  for (Type t : kBlockTypes) {
    const auto back = ggml::dequantize(ggml::quantize(flat, t));
    CHECK(back[0].abs().max().item<float>() == 0.0f);
    CHECK((back[1] - 0.75).abs().max().item<float>() < 0.75 * 0.01);
  }
}

TEST_CASE("ggml quantize and dequantize reject what they cannot take", "[ggml_quant]") {
  CHECK_THROWS_AS(ggml::quantize(torch::randn({4, 100}), Type::Q4_0), Error);
  CHECK_THROWS_AS(ggml::quantize(torch::randn({4, 288}), Type::Q4_K), Error);
  CHECK_THROWS_AS(ggml::quantize(torch::randn({256}), Type::Q6_K), Error);
  CHECK_THROWS_AS(ggml::quantize(torch::randn({4, 256}), Type::F16), Error);
  CHECK_THROWS_AS(ggml::quantize(torch::ones({4, 256}, torch::kInt32), Type::Q8_0), Error);
  CHECK_THROWS_AS(ggml::dequantize(torch::zeros({4, 288}, torch::kUInt8)), Error);
  CHECK_THROWS_AS(ggml::quantize(torch::randn({4, 256}), static_cast<Type>(99)), Error);
}

TEST_CASE("block-quantized integer kernels equal the scalar reference bitwise",
          "[ggml_quant][kernels]") {
  test::KernelGuard guard;
  torch::NoGradGuard no_grad;
  std::vector<QuantKernel> kernels;
  for (QuantKernel k : {QuantKernel::kAvx2, QuantKernel::kAvx512Vnni}) {
    if (quant_kernel_available(k)) {
      kernels.push_back(k);
    } else {
      WARN("skipped: the " << quant_kernel_name(k) << " kernel is not available on this CPU/build");
    }
  }
  torch::manual_seed(11);
  for (Type t : kBlockTypes) {
    const int64_t b = ggml::block_elements(t);
    for (int64_t k : {b, 3 * b, b == 32 ? int64_t{32 * 25} : int64_t{256 * 4}}) {
      for (int64_t n : {1, 7, 66, 200}) {
        const auto w = ggml::quantize(torch::randn({n, k}), t);
        const auto wf = ggml::dequantize(w).to(torch::kFloat64);
        // Row counts below, at and past the AVX-512 kernels' tile of 16 rows, with partial
        // tiles after full ones (17, 33).
        for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64, 160}) {
          CAPTURE(ggml::type_name(t), k, n, m);
          const auto x = torch::randn({m, k}) * 3;
          const auto ref = quant_linear_integer(x, w, QuantKernel::kScalar);
          // The scalar kernel is the f32 product of x rounded to 8 bits with the weights.
          const auto want = torch::linear(rounded_x(x, x_block(t)).to(torch::kFloat64), wf);
          const double scale =
              torch::linear(x.abs().to(torch::kFloat64), wf.abs()).max().item<double>();
          CHECK((ref.to(torch::kFloat64) - want).abs().max().item<double>() <= 2e-6 * scale);
          for (QuantKernel kernel : kernels) {
            for (int threads : {1, 2}) {
              set_kernel_threads(threads);
              CAPTURE(quant_kernel_name(kernel), threads);
              CHECK(torch::equal(quant_linear_integer(x, w, kernel), ref));
            }
          }
          // The dequantize + GEMM path: the same products, in f32.
          const auto full = quant_linear_dequant(x, w).to(torch::kFloat64);
          CHECK((full - want).abs().max().item<double>() <= 2e-6 * scale);
          CHECK(torch::equal(quant_rounded_x(x, w), rounded_x(x, x_block(t))));
        }
      }
    }
  }
}

TEST_CASE("the SIMD dequantization equals the scalar reference bitwise", "[ggml_quant][kernels]") {
  torch::manual_seed(13);
  for (QuantKernel kernel : {QuantKernel::kAvx2, QuantKernel::kAvx512Vnni}) {
    if (!quant_kernel_available(kernel)) {
      WARN("skipped: the " << quant_kernel_name(kernel) << " kernel is not available here");
      continue;
    }
    for (Type t : kBlockTypes) {
      CAPTURE(quant_kernel_name(kernel), ggml::type_name(t));
      // Random blocks: scales of both signs, every bit pattern of the values (-0 included).
      const auto w = test::random_blocks(40, 512, t);
      CHECK(torch::equal(dequantize_with(w, kernel).view(torch::kInt32),
                         ggml::dequantize(w).view(torch::kInt32)));
    }
  }
}

TEST_CASE("linear_layer takes block-quantized weights under every kernel selection",
          "[ggml_quant][cpu_linear]") {
  test::KernelGuard guard;
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const auto w = ggml::quantize(torch::randn({96, 512}), Type::Q4_K);
  const auto wf = ggml::dequantize(w);
  const auto x = torch::randn({2, 5, 512});
  const auto x_big = torch::randn({3, 12, 512});
  // Off: the reference, torch::linear of x rounded to 8 bits per 256 on the dequantized weights.
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  CHECK_FALSE(quant_kernel_in_use().has_value());
  const auto xr = rounded_x(x, 256).view_as(x), xr_big = rounded_x(x_big, 256).view_as(x_big);
  CHECK(torch::equal(linear_layer(x, w), torch::linear(xr, wf)));
  CHECK(torch::equal(linear_layer(x_big, w), torch::linear(xr_big, wf)));
  // The rounding of x (blocks of 256) costs about 0.7% RMS of the output against f32 x.
  const auto exact = torch::linear(x, wf);
  const double x_error =
      ((torch::linear(xr, wf) - exact).pow(2).mean() / exact.pow(2).mean()).sqrt().item<double>();
  WARN("8-bit x: RMS relative output error " << x_error);
  CHECK(x_error < 0.01);
  const auto kernels = test::available_kernels();
  if (kernels.empty()) WARN("skipped: no SIMD kernel selection on this CPU");
  for (auto kernel : kernels) {
    REQUIRE(select_cpu_linear(kernel));
    const auto in_use = quant_kernel_in_use();
    REQUIRE(in_use.has_value());
    CAPTURE(cpu_linear_name(kernel), quant_kernel_name(*in_use));
    // The integer kernel at every row count: a row's result is bitwise the same alone.
    const auto got = linear_layer(x, w);
    REQUIRE(got.sizes() == torch::IntArrayRef({2, 5, 96}));
    CHECK(torch::equal(got, quant_linear_integer(x, w, *in_use)));
    const auto one = linear_layer(x[0], w);
    CHECK(torch::equal(one, got[0]));
    CHECK(torch::equal(linear_layer(x_big, w)[1][3], linear_layer(x_big[1][3], w)));
    // Either path: the reference's products up to f32 rounding, whatever the rows of the call.
    CHECK(torch::allclose(one, torch::linear(xr[0], wf), 1e-5, 1e-4));
    CHECK(torch::allclose(got, torch::linear(xr, wf), 1e-5, 1e-4));
    CHECK(torch::allclose(linear_layer(x_big, w), torch::linear(xr_big, wf), 1e-5, 1e-4));
  }
  // A weight whose k differs from x's.
  CHECK_THROWS_AS(linear_layer(torch::randn({2, 256}), w), Error);
}
