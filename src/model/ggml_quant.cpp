// src/model/ggml_quant.cpp — GGML's type table and the tensor-level quantize/dequantize of block-
// quantized weights (promptcache/model/ggml_quant.hpp); the per-block work is the scalar
// reference in kernels/quant_scalar.cpp, split over the kernel threads by rows.
#include "promptcache/model/ggml_quant.hpp"

#include <algorithm>
#include <string>

#include "kernels/quant_blocks.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/work_pool.hpp"

namespace promptcache::ggml {
namespace {

namespace kq = kernels::quant;

struct TypeInfo {
  Type type;
  std::string_view name;
  int64_t elements, bytes;
};
constexpr TypeInfo kTypes[] = {
    {Type::F32, "F32", 1, 4},       {Type::F16, "F16", 1, 2},       {Type::Q4_0, "Q4_0", 32, 18},
    {Type::Q5_0, "Q5_0", 32, 22},   {Type::Q5_1, "Q5_1", 32, 24},   {Type::Q8_0, "Q8_0", 32, 34},
    {Type::Q4_K, "Q4_K", 256, 144}, {Type::Q5_K, "Q5_K", 256, 176}, {Type::Q6_K, "Q6_K", 256, 210},
    {Type::BF16, "BF16", 1, 2},
};

const TypeInfo& info(Type t) {
  for (const auto& i : kTypes) {
    if (i.type == t) return i;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "unknown GGML type id " + std::to_string(static_cast<uint32_t>(t)));
}

std::optional<kq::Format> format_of(Type t) {
  switch (t) {
    case Type::Q4_0:
      return kq::Format::kQ4_0;
    case Type::Q8_0:
      return kq::Format::kQ8_0;
    case Type::Q4_K:
      return kq::Format::kQ4_K;
    case Type::Q5_K:
      return kq::Format::kQ5_K;
    case Type::Q6_K:
      return kq::Format::kQ6_K;
    case Type::Q5_0:
      return kq::Format::kQ5_0;
    case Type::Q5_1:
      return kq::Format::kQ5_1;
    default:
      return std::nullopt;
  }
}

// Runs fn(r0, r1) over [0, n) rows in chunks on the kernel threads.
template <class Fn>
void split_rows(int64_t n, int64_t row_elements, const Fn& fn) {
  const int64_t per_chunk =
      std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, row_elements));
  const int64_t chunks = (n + per_chunk - 1) / per_chunk;
  parallel_chunks(chunks, kernel_threads(), [&](int64_t c) {
    const int64_t r0 = c * per_chunk;
    fn(r0, std::min(n, r0 + per_chunk));
  });
}

}  // namespace

std::string_view type_name(Type t) {
  return info(t).name;
}

std::optional<Type> type_from_id(uint32_t id) {
  for (const auto& i : kTypes) {
    if (static_cast<uint32_t>(i.type) == id) return i.type;
  }
  return std::nullopt;
}

int64_t block_elements(Type t) {
  return info(t).elements;
}

int64_t block_bytes(Type t) {
  return info(t).bytes;
}

std::optional<Type> quant_type_of(const torch::Tensor& weight) {
  if (!weight.defined() || weight.scalar_type() != torch::kUInt8 || weight.dim() != 3) {
    return std::nullopt;
  }
  for (Type t :
       {Type::Q4_0, Type::Q5_0, Type::Q5_1, Type::Q8_0, Type::Q4_K, Type::Q5_K, Type::Q6_K}) {
    if (weight.size(2) == block_bytes(t)) return t;
  }
  return std::nullopt;
}

torch::Tensor quantize(const torch::Tensor& w, Type t) {
  const auto format = format_of(t);
  if (!format) {
    throw Error(ErrorKind::kInvalidArgument,
                "quantize: " + std::string(type_name(t)) + " is not a block-quantized type");
  }
  if (w.dim() != 2 || !w.is_floating_point()) {
    throw Error(ErrorKind::kInvalidArgument,
                "quantize: expected a 2-D float matrix, got " + std::to_string(w.dim()) + " dims");
  }
  const int64_t n = w.size(0), k = w.size(1), b = block_elements(t);
  if (k % b != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "quantize: " + std::string(type_name(t)) + " needs rows of a multiple of " +
                    std::to_string(b) + " values; got " + std::to_string(k));
  }
  const int64_t row_bytes = k / b * block_bytes(t);
  auto out = torch::empty({n, k / b, block_bytes(t)}, torch::TensorOptions().dtype(torch::kUInt8));
  if (n == 0 || k == 0) return out;
  // In slices of rows: the f32 copy of a whole 128k-vocabulary embedding would be GBs.
  const int64_t slice = std::max<int64_t>(1, (int64_t{16} << 20) / k);
  uint8_t* op = out.data_ptr<uint8_t>();
  for (int64_t s0 = 0; s0 < n; s0 += slice) {
    const int64_t rows = std::min(slice, n - s0);
    const auto f = w.narrow(0, s0, rows).to(torch::kCPU, torch::kFloat32).contiguous();
    const float* fp = f.data_ptr<float>();
    split_rows(rows, k, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        kq::quantize_row(*format, fp + r * k, k, op + (s0 + r) * row_bytes);
      }
    });
  }
  return out;
}

torch::Tensor dequantize(const torch::Tensor& q) {
  const auto t = quant_type_of(q);
  if (!t) {
    throw Error(ErrorKind::kInvalidArgument,
                "dequantize: not a block-quantized tensor (uint8 [n, blocks, bytes] with bytes "
                "18, 22, 24, 34, 144, 176 or 210)");
  }
  const auto format = *format_of(*t);
  const auto qc = q.to(torch::kCPU).contiguous();
  const int64_t n = qc.size(0), k = qc.size(1) * block_elements(*t);
  const int64_t row_bytes = qc.size(1) * qc.size(2);
  auto out = torch::empty({n, k}, torch::TensorOptions().dtype(torch::kFloat32));
  if (n == 0 || k == 0) return out;
  const uint8_t* qp = qc.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  split_rows(n, k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) kq::dequantize_row(format, qp + r * row_bytes, k, op + r * k);
  });
  return out;
}

}  // namespace promptcache::ggml
