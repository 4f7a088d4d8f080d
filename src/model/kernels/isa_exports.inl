// src/model/kernels/isa_exports.inl — included last by avx2.cpp and avx512.cpp, with
// PROMPTCACHE_ISA set to the file's suffix (avx2, avx512), PROMPTCACHE_ISA_WIDTH to its vector
// width and PROMPTCACHE_ISA_BUILT defined where the compiler built the kernels: the exported
// pointers of kernels.hpp's PROMPTCACHE_ISA_KERNELS list, each the file's kernel of that name,
// or null where the instruction set is not built (the dispatch in cpu_linear.cpp and
// cpu_attention.cpp checks for null).
#define PROMPTCACHE_ISA_NAME_(name, isa) name##_##isa
#define PROMPTCACHE_ISA_NAME(name, isa) PROMPTCACHE_ISA_NAME_(name, isa)

namespace promptcache::kernels {
#ifdef PROMPTCACHE_ISA_BUILT
#define PROMPTCACHE_DEFINE_ISA_KERNEL(type, name) \
  const type PROMPTCACHE_ISA_NAME(name, PROMPTCACHE_ISA) = &name;
static_assert(Vec::kWidth == PROMPTCACHE_ISA_WIDTH);
#else
#define PROMPTCACHE_DEFINE_ISA_KERNEL(type, name) \
  const type PROMPTCACHE_ISA_NAME(name, PROMPTCACHE_ISA) = nullptr;
#endif
PROMPTCACHE_ISA_KERNELS(PROMPTCACHE_DEFINE_ISA_KERNEL)
#undef PROMPTCACHE_DEFINE_ISA_KERNEL
}  // namespace promptcache::kernels
