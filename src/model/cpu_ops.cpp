#include "promptcache/model/cpu_ops.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/cpu_linear.hpp"

namespace promptcache {
namespace {

[[noreturn]] void refuse(const std::string& op, const std::string& why) {
  throw Error(ErrorKind::kInvalidArgument, op + ": " + why);
}

bool cpu_f32(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == torch::kFloat32;
}

// Rotates one head of d values: out = (x * cos + rotate_half(x) * sin) * scale, in the order of
// the library operators it replaces (products, then their sum, then the scale).
void rotate_head(const float* x, const float* cos, const float* sin, int64_t d, float scale,
                 float* out) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    out[j] = (x[j] * cos[j] + (-x[j + half]) * sin[j]) * scale;
    out[j + half] = (x[j + half] * cos[j + half] + x[j] * sin[j + half]) * scale;
  }
}

}  // namespace

bool cpu_small_ops_apply(const torch::Tensor& x) {
  if (!cpu_f32(x) || x.dim() < 1 || cpu_linear_kernel() == CpuLinearKernel::kNone) return false;
  if (at::GradMode::is_enabled() && x.requires_grad()) return false;
  const int64_t width = x.size(-1);
  return width > 0 && x.numel() / width <= kCpuLinearMaxRows;
}

torch::Tensor cpu_rms_norm(const torch::Tensor& x_in, const torch::Tensor& weight_in, double eps) {
  const std::string op = "cpu_rms_norm";
  if (!cpu_f32(x_in) || !cpu_f32(weight_in)) refuse(op, "takes f32 tensors on the CPU");
  if (x_in.dim() < 1 || weight_in.dim() != 1 || weight_in.size(0) != x_in.size(-1)) {
    refuse(op, "weight must be [h] for x [..., h]");
  }
  const auto x = x_in.contiguous();
  const auto weight = weight_in.contiguous();
  auto out = torch::empty_like(x);
  const int64_t h = x.size(-1);
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* outp = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * h;
    // Eight independent sums: one chain of dependent adds would wait on each add's latency.
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    for (; j + 8 <= h; j += 8) {
      for (int u = 0; u < 8; ++u) part[u] += static_cast<double>(xr[j + u]) * xr[j + u];
    }
    for (; j < h; ++j) part[0] += static_cast<double>(xr[j]) * xr[j];
    const double squares =
        ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const auto inv = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(h) + eps));
    float* o = outp + r * h;
    for (j = 0; j < h; ++j) o[j] = wp[j] * (xr[j] * inv);
  }
  return out;
}

torch::Tensor cpu_rope_into_cache(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                  const torch::Tensor& v_in, const torch::Tensor& cos_in,
                                  const torch::Tensor& sin_in, double q_scale,
                                  const torch::Tensor& key_dst, const torch::Tensor& value_dst) {
  const std::string op = "cpu_rope_into_cache";
  for (const auto* t : {&q_in, &k_in, &v_in, &cos_in, &sin_in, &key_dst, &value_dst}) {
    if (!cpu_f32(*t)) refuse(op, "takes f32 tensors on the CPU");
  }
  if (q_in.dim() != 3 || k_in.dim() != 3 || v_in.dim() != 3 || cos_in.dim() != 3 ||
      sin_in.dim() != 3 || key_dst.dim() != 4 || value_dst.dim() != 4) {
    refuse(op, "q, k, v, cos and sin must be [b, n, ...] and the cache views [b, kv_heads, n, d]");
  }
  const int64_t b = q_in.size(0), n = q_in.size(1), d = cos_in.size(2);
  const int64_t hkv = key_dst.size(1);
  if (d <= 0 || d % 2 != 0 || hkv <= 0 || q_in.size(2) % d != 0) {
    refuse(op, "q must hold whole heads of an even size d (the last dim of cos)");
  }
  const int64_t hq = q_in.size(2) / d;
  const std::vector<int64_t> rows_shape{b, n, d}, kv_shape{b, n, hkv * d}, dst_shape{b, hkv, n, d};
  if (cos_in.sizes().vec() != rows_shape || sin_in.sizes().vec() != rows_shape ||
      k_in.sizes().vec() != kv_shape || v_in.sizes().vec() != kv_shape ||
      key_dst.sizes().vec() != dst_shape || value_dst.sizes().vec() != dst_shape || hq % hkv != 0) {
    refuse(op,
           "shapes do not match: q [b, n, heads * d], k and v [b, n, kv_heads * d], cos and "
           "sin [b, n, d], cache views [b, kv_heads, n, d], heads a multiple of kv_heads");
  }
  if (key_dst.stride(3) != 1 || key_dst.stride(2) != d || value_dst.stride(3) != 1 ||
      value_dst.stride(2) != d) {
    refuse(op, "each cache row must be a dense row of d values");
  }
  const auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
  auto out = torch::empty({b, hq, n, d}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* outp = out.data_ptr<float>();
  float* kd = key_dst.data_ptr<float>();
  float* vd = value_dst.data_ptr<float>();
  const auto scale = static_cast<float>(q_scale);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = bi * n + i;
      const float* c = cp + row * d;
      const float* s = sp + row * d;
      for (int64_t h = 0; h < hq; ++h) {
        rotate_head(qp + (row * hq + h) * d, c, s, d, scale, outp + ((bi * hq + h) * n + i) * d);
      }
      for (int64_t h = 0; h < hkv; ++h) {
        const int64_t dst = bi * key_dst.stride(0) + h * key_dst.stride(1) + i * d;
        rotate_head(kp + (row * hkv + h) * d, c, s, d, 1.0f, kd + dst);
        const float* vr = vp + (row * hkv + h) * d;
        float* vo = vd + bi * value_dst.stride(0) + h * value_dst.stride(1) + i * d;
        for (int64_t j = 0; j < d; ++j) vo[j] = vr[j];
      }
    }
  }
  return out;
}

}  // namespace promptcache
