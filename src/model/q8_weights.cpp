#include "promptcache/model/q8_weights.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "promptcache/error.hpp"

namespace promptcache {

torch::Tensor quantize_q8(const torch::Tensor& w) {
  if (w.dim() != 2) {
    throw Error(ErrorKind::kInvalidArgument,
                "q8 quantizes matrices; got a tensor of " + std::to_string(w.dim()) + " dims");
  }
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t blocks = (k + kQ8BlockSize - 1) / kQ8BlockSize;
  auto out = torch::empty({n, q8_row_bytes(k)}, torch::TensorOptions().dtype(torch::kInt8));
  if (n == 0 || k == 0) return out;
  // In slices of rows: the f32 copy of a whole 128k-vocabulary embedding would be GBs.
  const int64_t slice = std::max<int64_t>(1, (int64_t{16} << 20) / (blocks * kQ8BlockSize));
  for (int64_t r0 = 0; r0 < n; r0 += slice) {
    const int64_t rows = std::min(slice, n - r0);
    auto f = w.narrow(0, r0, rows).to(torch::kCPU, torch::kFloat32);
    if (blocks * kQ8BlockSize != k) {  // pad the last block with zeros
      f = torch::constant_pad_nd(f, {0, blocks * kQ8BlockSize - k}, 0.0);
    }
    f = f.reshape({rows, blocks, kQ8BlockSize});
    auto scale = f.abs().amax(-1) / 127.0;  // [rows, blocks]
    auto inverse = torch::where(scale > 0, scale.reciprocal(), torch::zeros_like(scale));
    auto values = (f * inverse.unsqueeze(-1)).round().clamp(-127, 127).to(torch::kInt8);
    values = values.reshape({rows, blocks * kQ8BlockSize}).narrow(1, 0, k).contiguous();
    auto scale16 = scale.to(torch::kFloat16).contiguous();
    const auto* v = values.data_ptr<int8_t>();
    const auto* s = reinterpret_cast<const unsigned char*>(scale16.data_ptr());
    auto* o = out.data_ptr<int8_t>() + r0 * q8_row_bytes(k);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(o + r * q8_row_bytes(k), v + r * k, static_cast<std::size_t>(k));
      std::memcpy(o + r * q8_row_bytes(k) + k, s + r * blocks * 2,
                  static_cast<std::size_t>(blocks * 2));
    }
  }
  return out;
}

int64_t q8_in_features(const torch::Tensor& q) {
  if (q.dim() < 1) return -1;
  const int64_t width = q.size(-1);
  // q8_row_bytes grows by 1 or 3 per k, so k lies just below width * 32 / 34.
  for (int64_t k = std::max<int64_t>(0, width * kQ8BlockSize / (kQ8BlockSize + 2) - 2); k <= width;
       ++k) {
    if (q8_row_bytes(k) == width) return k;
    if (q8_row_bytes(k) > width) break;
  }
  return -1;
}

torch::Tensor dequantize_q8(const torch::Tensor& q, int64_t k) {
  if (q.scalar_type() != torch::kInt8 || q.dim() < 1 || q.size(-1) != q8_row_bytes(k)) {
    throw Error(ErrorKind::kInvalidArgument, "not a q8 tensor of " + std::to_string(k) +
                                                 " weights per row (int8, width " +
                                                 std::to_string(q8_row_bytes(k)) + ")");
  }
  const int64_t blocks = (k + kQ8BlockSize - 1) / kQ8BlockSize;
  auto rows = q.reshape({-1, q.size(-1)}).to(torch::kCPU).contiguous();
  const int64_t n = rows.size(0);
  auto values = rows.narrow(1, 0, k).to(torch::kFloat32);
  // The scales' bytes, reassembled into f16 values.
  auto bytes = rows.narrow(1, k, 2 * blocks).contiguous();
  auto scale16 = torch::empty({n, blocks}, torch::TensorOptions().dtype(torch::kFloat16));
  std::memcpy(scale16.data_ptr(), bytes.data_ptr(), static_cast<std::size_t>(n * blocks * 2));
  auto scale = scale16.to(torch::kFloat32).repeat_interleave(kQ8BlockSize, 1).narrow(1, 0, k);
  auto sizes = q.sizes().vec();
  sizes.back() = k;
  return (values * scale).reshape(sizes);
}

}  // namespace promptcache
