#include "promptcache/model/cpu_attention.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache {
namespace {

struct AttendKernel {
  kernels::AttendRowsFn fn = nullptr;
  int64_t width = 0;
};

// The widest kernel at or below the selected one whose vector width divides the head size
// (a head of 8, as in stories260K, takes the AVX2 kernel on an AVX-512 processor).
AttendKernel kernel_for(int64_t head_dim) {
  CpuLinearKernel selected = cpu_linear_kernel();
  // The attention is the same under both AVX-512 settings (they differ for bf16 weights only).
  if (selected == CpuLinearKernel::kAvx512Bf16) selected = CpuLinearKernel::kAvx512;
  if (head_dim <= 0) return {};
  if (selected == CpuLinearKernel::kAvx512 && kernels::attend_rows_avx512 != nullptr &&
      head_dim % kernels::kAvx512Width == 0) {
    return {kernels::attend_rows_avx512, kernels::kAvx512Width};
  }
  // Every AVX-512 processor this project has met also has AVX2 + FMA; checked all the same.
#if defined(__x86_64__)
  const bool avx2 = selected == CpuLinearKernel::kAvx2 ||
                    (selected == CpuLinearKernel::kAvx512 && __builtin_cpu_supports("avx2") &&
                     __builtin_cpu_supports("fma"));
#else
  const bool avx2 = false;
#endif
  if (avx2 && kernels::attend_rows_avx2 != nullptr && head_dim % kernels::kAvx2Width == 0) {
    return {kernels::attend_rows_avx2, kernels::kAvx2Width};
  }
  return {};
}

}  // namespace

bool cpu_attention_bf16_dot(int64_t head_dim) {
  return cpu_linear_kernel() == CpuLinearKernel::kAvx512Bf16 &&
         kernels::attend_rows_bf16_avx512bf16 != nullptr && head_dim > 0 &&
         head_dim % kernels::kAvx512Width == 0;
}

bool cpu_attention_available(int64_t head_dim) {
  return kernel_for(head_dim).fn != nullptr;
}

namespace {

// The kernel's element type for keys and values of `dtype`; false for dtypes it does not read.
bool kv_type_of(torch::Dtype dtype, kernels::KvType& kv) {
  switch (dtype) {
    case torch::kFloat32:
      kv = kernels::KvType::kF32;
      return true;
    case torch::kBFloat16:
      kv = kernels::KvType::kBf16;
      return true;
    case torch::kFloat16:
      kv = kernels::KvType::kF16;
      return true;
    default:
      return false;
  }
}

}  // namespace

bool cpu_attention_takes(const torch::TensorOptions& options, int64_t head_dim) {
  kernels::KvType kv;
  return options.device().is_cpu() && kv_type_of(c10::typeMetaToScalarType(options.dtype()), kv) &&
         cpu_attention_available(head_dim);
}

std::vector<KVSegment> first_slots(const std::vector<KVSegment>& segments, int64_t count) {
  std::vector<KVSegment> out;
  for (const auto& s : segments) {
    if (count <= 0) break;
    const int64_t take = std::min(count, s.slots());
    out.push_back(
        take == s.slots() ? s : KVSegment{s.keys.narrow(2, 0, take), s.values.narrow(2, 0, take)});
    count -= take;
  }
  return out;
}

std::vector<KVSegment> slot_range(const std::vector<KVSegment>& segments, int64_t begin,
                                  int64_t count) {
  std::vector<KVSegment> out;
  for (const auto& s : segments) {
    if (count <= 0) break;
    if (begin >= s.slots()) {
      begin -= s.slots();
      continue;
    }
    const int64_t take = std::min(count, s.slots() - begin);
    out.push_back(take == s.slots()
                      ? s
                      : KVSegment{s.keys.narrow(2, begin, take), s.values.narrow(2, begin, take)});
    count -= take;
    begin = 0;
  }
  return out;
}

torch::Tensor attend_few_queries(const torch::Tensor& qg, const torch::Tensor& keys,
                                 const torch::Tensor& values, const torch::Tensor& mask,
                                 int64_t open, int threads, const AttentionBias& bias) {
  return attend_few_queries(qg, std::vector<KVSegment>{{keys, values}}, mask, open, threads, bias);
}

torch::Tensor attend_few_queries(const torch::Tensor& qg, const std::vector<KVSegment>& segments,
                                 const torch::Tensor& mask_in, int64_t open, int threads,
                                 const AttentionBias& bias) {
  auto refuse = [](const std::string& why) {
    throw Error(ErrorKind::kInvalidArgument, "attend_few_queries: " + why);
  };
  if (qg.dim() != 4) refuse("queries must be [batch, kv_heads, rows, head_dim]");
  if (segments.empty()) refuse("needs at least one run of slots");
  const int64_t b = qg.size(0), hkv = qg.size(1), rows = qg.size(2), d = qg.size(3);
  if (!qg.device().is_cpu() || qg.scalar_type() != torch::kFloat32) {
    refuse("takes f32 tensors on the CPU");
  }
  // Where each run's head (batch row 0, head 0) starts, and its batch and head strides (batch
  // stride 0 for a run shared by every batch row).
  struct Run {
    const char *k, *v;  // bytes: offsets below are in elements of the runs' dtype
    int64_t slots, k_batch, k_head, v_batch, v_head;
  };
  std::vector<Run> runs;
  int64_t slots = 0;
  kernels::KvType kv = kernels::KvType::kF32;
  const torch::Dtype kv_dtype =
      segments.front().keys.defined() ? segments.front().keys.scalar_type() : torch::kFloat32;
  if (!kv_type_of(kv_dtype, kv)) refuse("keys and values must be f32, bf16 or f16");
  for (const auto& s : segments) {
    const auto& k = s.keys;
    const auto& v = s.values;
    if (!k.defined() || !v.defined() || k.dim() != 4 || k.sizes() != v.sizes()) {
      refuse("keys and values must be [batch, kv_heads, slots, head_dim] of the same shape");
    }
    if ((k.size(0) != b && k.size(0) != 1) || k.size(1) != hkv || k.size(3) != d) {
      refuse(
          "keys and values must be [batch or 1, kv_heads, slots, head_dim] matching the "
          "queries");
    }
    if (!k.device().is_cpu() || !v.device().is_cpu() || k.scalar_type() != kv_dtype ||
        v.scalar_type() != kv_dtype) {
      refuse("takes keys and values on the CPU, all of one dtype (f32, bf16 or f16)");
    }
    if (k.stride(3) != 1 || k.stride(2) != d || v.stride(3) != 1 || v.stride(2) != d) {
      refuse("each key and value must be a dense row of head_dim values");
    }
    const bool shared = k.size(0) == 1;
    runs.push_back({static_cast<const char*>(k.data_ptr()), static_cast<const char*>(v.data_ptr()),
                    k.size(2), shared ? 0 : k.stride(0), k.stride(1), shared ? 0 : v.stride(0),
                    v.stride(1)});
    slots += k.size(2);
  }
  AttendKernel kernel = kernel_for(d);
  // bf16 keys and values for the rows the lanes take: multiplied as stored, with vdpbf16ps.
  if (kernel.fn != nullptr && kv == kernels::KvType::kBf16 && rows >= kernels::kAttendLaneMinRows &&
      cpu_attention_bf16_dot(d)) {
    kernel.fn = kernels::attend_rows_bf16_avx512bf16;
  }
  if (kernel.fn == nullptr) {
    refuse("no fused kernel for a head of " + std::to_string(d) +
           " with the CPU kernels selected now (" + cpu_linear_name(cpu_linear_kernel()) + ")");
  }
  if (open < 0 || open > slots) refuse("open must be within [0, slots]");
  torch::Tensor mask;
  int64_t tokens = rows;
  if (mask_in.defined()) {
    const bool shape_ok = (mask_in.dim() == 2 || (mask_in.dim() == 3 && mask_in.size(0) == b)) &&
                          mask_in.size(-1) == slots && mask_in.size(-2) > 0 &&
                          rows % mask_in.size(-2) == 0;
    if (!shape_ok) {
      refuse("the mask must be [n, slots] or [batch, n, slots], with rows a multiple of n");
    }
    // A block's rows and visible columns of a larger mask are read in place: only the columns
    // must be dense.
    mask = mask_in.to(torch::kCPU, torch::kBool);
    if (mask.stride(-1) != 1) mask = mask.contiguous();
    tokens = mask.size(-2);
  }
  // ALiBi: positions as dense f32 rows, the tokens per query head from the query positions.
  torch::Tensor slopes, key_pos, query_pos;
  if (bias.defined()) {
    auto dense_f32 = [](const torch::Tensor& t) {
      return t.to(torch::kCPU, torch::kFloat32).contiguous();
    };
    slopes = dense_f32(bias.slopes);
    key_pos = dense_f32(bias.key_positions);
    query_pos = dense_f32(bias.query_positions);
    const int64_t n = query_pos.dim() == 2 ? query_pos.size(1) : 0;
    const bool ok = key_pos.dim() == 2 && (key_pos.size(0) == b || key_pos.size(0) == 1) &&
                    key_pos.size(1) == slots && query_pos.dim() == 2 &&
                    (query_pos.size(0) == b || query_pos.size(0) == 1) && n > 0 && rows % n == 0 &&
                    slopes.dim() == 1 && slopes.size(0) == hkv * (rows / n) &&
                    (!mask.defined() || tokens == n);
    if (!ok) {
      refuse(
          "the ALiBi bias must be slopes [kv_heads * groups], key positions [batch or 1, slots] "
          "and query positions [batch or 1, n] with rows = groups * n (and n the mask's rows)");
    }
    tokens = n;
  }
  const auto q = qg.contiguous();
  auto out = torch::empty({b, hkv, rows, d}, qg.options());
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const bool* mp = mask.defined() ? mask.data_ptr<bool>() : nullptr;
  const int64_t tasks = b * hkv;
  const int team = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tasks)));
  // Kept per thread between calls: a layer's scratch is a few hundred KB, and a fresh allocation
  // of that size would be mapped (and page-faulted) anew on every call.
  const auto need = static_cast<std::size_t>(kernels::attend_scratch_floats(d, slots));
  const auto element = static_cast<int64_t>(c10::elementSize(kv_dtype));
  parallel_chunks(tasks, team, [&](int64_t task) {
    thread_local std::vector<float> scratch;
    thread_local std::vector<kernels::AttendSegment> heads;
    if (scratch.size() < need) scratch.resize(need);
    heads.resize(runs.size());
    const int64_t bi = task / hkv, h = task % hkv;
    for (std::size_t s = 0; s < runs.size(); ++s) {
      const Run& run = runs[s];
      heads[s] = {run.k + (bi * run.k_batch + h * run.k_head) * element,
                  run.v + (bi * run.v_batch + h * run.v_head) * element, run.slots};
    }
    kernels::AttendArgs a;
    a.q = qp + task * rows * d;
    a.rows = rows;
    a.d = d;
    a.segments = heads.data();
    a.segment_count = static_cast<long long>(heads.size());
    a.slots = slots;
    if (mp != nullptr) {
      a.mask = mask.dim() == 3 ? mp + bi * mask.stride(0) : mp;
      a.mask_ld = mask.stride(-2);
    }
    a.tokens = tokens;
    a.open = open;
    a.out = op + task * rows * d;
    a.scratch = scratch.data();
    a.kv = kv;
    if (slopes.defined()) {
      a.slopes = slopes.data_ptr<float>() + h * (rows / tokens);
      a.key_pos = key_pos.data_ptr<float>() + (key_pos.size(0) == 1 ? 0 : bi) * slots;
      a.query_pos = query_pos.data_ptr<float>() + (query_pos.size(0) == 1 ? 0 : bi) * tokens;
    }
    kernel.fn(a);
  });
  return out;
}

}  // namespace promptcache
