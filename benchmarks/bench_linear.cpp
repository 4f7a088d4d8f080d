// bench_linear — ms per linear_layer() call for f32, bf16, f16 and q8 weights and GGML's block
// types q4_0, q8_0, q4_k, q5_k, q6_k (promptcache/model/ggml_quant.hpp; x and the output f32) on
// bench-small's layer shapes, all dtypes timed in the same run.
//
//   build/benchmarks/bench_linear [--rows 1,16,64,128]
//       [--dtypes f32,bf16,f16,q8,bf16dot,q4_0,q8_0,q4_k,q5_k,q6_k,q4_k_gemm,...]
//       [--shapes 768x768,2048x768,768x2048] [--threads 2] [--repeats 7] [--kernels on]
//       [--cold-mb 64]
//
// A block type with "_gemm" appended (q4_k_gemm) times the dequantize + GEMM path
// (quant_linear_dequant) instead of linear_layer's integer kernels.
// "bf16dot" is bf16 weights under the avx512-bf16 kernel (vdpbf16ps, x rounded to bf16) whatever
// --kernels says, so `--kernels avx512 --dtypes f32,bf16,bf16dot` compares f32 weights, bf16
// widened to f32 and bf16 dot products in one run (exits 2 where the processor lacks
// AVX512_BF16).
//
// A shape is out x in (the weight's [n, k]). Each dtype's weights are cycled over as many copies
// as make --cold-mb MB of f32 weights, so every call streams its weights from memory, as a
// decoder layer's linears do (bench-small's 12 layers hold 340 MB of f32 weights). One JSON line
// per kernel setting, shape and row count: the BEST ms per call of --repeats (the machine is
// shared with builds), the median, and each dtype's best against f32's. The dtypes alternate
// within each repeat, so a disturbance hits them alike.
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_ggml.hpp"
#include "bench_kernels.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/quant_linear.hpp"
#include "promptcache/model/threads.hpp"

namespace pc = promptcache;
using ordered_json = nlohmann::ordered_json;

namespace {

// The block type of a --dtypes name, "_gemm" ignored.
std::optional<pc::ggml::Type> block_type_of(const std::string& name) {
  const bool gemm = name.size() > 5 && name.compare(name.size() - 5, 5, "_gemm") == 0;
  return pc::bench::block_type_named(gemm ? name.substr(0, name.size() - 5) : name);
}

// linear_layer, or the dequantize + GEMM path for a "_gemm" name.
torch::Tensor run_linear(const std::string& d, const torch::Tensor& x, const torch::Tensor& w) {
  if (d.size() > 5 && d.compare(d.size() - 5, 5, "_gemm") == 0) {
    return pc::quant_linear_dequant(x, w);
  }
  return pc::linear_layer(x, w);
}

torch::Dtype dtype_named(const std::string& name) {
  if (block_type_of(name)) return torch::kUInt8;
  if (name == "f32") return torch::kFloat32;
  if (name == "bf16" || name == "bf16dot") return torch::kBFloat16;
  if (name == "f16") return torch::kFloat16;
  if (name == "q8") return torch::kInt8;
  std::cerr << "bench_linear: --dtypes takes f32, bf16, f16, q8, bf16dot, q4_0, q8_0, q4_k, q5_k, "
               "q6_k, not '"
            << name << "'\n";
  std::exit(2);
}

std::pair<int64_t, int64_t> shape_named(const std::string& text) {
  const auto x = text.find('x');
  if (x == std::string::npos) {
    std::cerr << "bench_linear: a shape is OUTxIN (768x2048), not '" << text << "'\n";
    std::exit(2);
  }
  return {std::stoll(text.substr(0, x)), std::stoll(text.substr(x + 1))};
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  pc::bench::Flags flags(argc, argv, "bench_linear",
                         {"rows", "dtypes", "shapes", "threads", "repeats", "kernels", "cold-mb"});
  const auto rows = flags.list("rows", {1, 16, 64, 128});
  const auto dtypes = flags.words("dtypes", "f32,bf16,f16");
  const auto shapes = flags.words("shapes", "768x768,2048x768,768x2048");
  const int threads = flags.integer("threads", 2);
  const int repeats = std::max(1, flags.integer("repeats", 7));
  const auto kernels = pc::bench::kernel_settings("bench_linear", flags.words("kernels", "on"));
  const double cold_mb = flags.integer("cold-mb", 64);
  for (const auto& d : dtypes) {
    if (d == "bf16dot" && !pc::select_cpu_linear(pc::CpuLinearKernel::kAvx512Bf16)) {
      std::cerr << "bench_linear: bf16dot needs AVX512_BF16 (vdpbf16ps), which this processor "
                   "or build lacks\n";
      return 2;
    }
  }
  torch::NoGradGuard no_grad;
  pc::set_kernel_threads(threads);
  at::set_num_threads(threads);
  torch::manual_seed(1);

  for (const auto& shape_text : shapes) {
    const auto [n, k] = shape_named(shape_text);
    const double f32_mb = static_cast<double>(n * k * 4) / (1 << 20);
    const int copies = std::max(1, static_cast<int>(cold_mb / f32_mb + 0.999));
    std::map<std::string, std::vector<torch::Tensor>> pools;
    for (int c = 0; c < copies; ++c) {
      const auto w = torch::randn({n, k}) * 0.05;
      for (const auto& d : dtypes) {
        const torch::Dtype dtype = dtype_named(d);
        if (const auto block = block_type_of(d)) {
          pools[d].push_back(pc::ggml::quantize(w, *block));
        } else {
          pools[d].push_back(dtype == torch::kInt8 ? pc::quantize_q8(w) : w.to(dtype).contiguous());
        }
      }
    }
    for (const auto kernel : kernels) {
      // The kernel each dtype runs under: --kernels', or avx512-bf16 for bf16dot.
      auto select_for = [&](const std::string& d) {
        pc::select_cpu_linear(d == "bf16dot" ? pc::CpuLinearKernel::kAvx512Bf16 : kernel);
      };
      for (const int m : rows) {
        const auto x = torch::randn({static_cast<int64_t>(m), k});
        std::map<std::string, std::vector<double>> times;
        for (const auto& d : dtypes) {  // warm-up: page in the weights, size the scratch
          select_for(d);
          for (const auto& w : pools[d]) run_linear(d, x, w);
        }
        for (int r = 0; r < repeats; ++r) {
          for (const auto& d : dtypes) {
            select_for(d);
            const double t0 = now_ms();
            for (const auto& w : pools[d]) run_linear(d, x, w);
            times[d].push_back((now_ms() - t0) / copies);
          }
        }
        pc::select_cpu_linear(kernel);
        ordered_json line;
        line["kernels"] = pc::cpu_linear_name(pc::cpu_linear_kernel());
        line["out"] = n;
        line["in"] = k;
        line["rows"] = m;
        line["threads"] = threads;
        line["copies"] = copies;
        for (const auto& d : dtypes) {
          line[d + "_ms"] = pc::bench::best_time(times[d]);
          line[d + "_median_ms"] = pc::bench::median_time(times[d]);
        }
        if (times.count("f32") != 0) {
          for (const auto& d : dtypes) {
            if (d == "f32") continue;
            line[d + "_vs_f32"] =
                pc::bench::best_time(times[d]) / pc::bench::best_time(times["f32"]);
          }
        }
        std::cout << line.dump() << std::endl;
      }
    }
  }
  return 0;
}
