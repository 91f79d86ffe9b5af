// After: the fused GEMM. Chapter 2's kernel (gemm_bf16_kernel.cuh: its main loop, one block per
// tile) instantiated with the fused epilogues of fused_epilogues.cuh, and the host code that picks
// the epilogue's kernel, validates and launches.
#include <string>
#include <type_traits>

// Angle brackets: the exercise build puts the skeleton's fused_epilogues.cuh first on the include path.
#include <fused_epilogues.cuh>

#include "fused_epilogue.hpp"
#include "gemm_bf16.hpp"
#include "gemm_bf16_kernel.cuh"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "kc/validate.hpp"

namespace kc::ch03 {

namespace {

using ch02::block::allow_shared_memory;
using ch02::block::DeviceLimits;
using ch02::block::for_each_tile_config;
using ch02::block::launch_tiles;
using ch02::block::Prefetch;
using ch02::block::SmallDeepTile;
using ch02::block::with_tile_config;

// True for the epilogues whose bias and residual the main loop may copy early (all of them).
template <class E>
inline constexpr bool kCopiesInputs = ch02::block::input_copies_of<E> != InputCopies::none;

// True for the register epilogue, which reads the Prefetch area whether or not there is a bias or
// a residual (zeros stand in for a missing one).
template <class E>
inline constexpr bool kInRegisters = ch02::block::input_copies_of<E> == InputCopies::with_last_slices;

// The most dynamic shared memory a launch of this kernel asks for: the pipeline's, plus the
// epilogue's Prefetch area where it fits this GPU.
template <class Cfg, class E>
int smem_bytes_with_prefetch(std::size_t smem_per_block_optin) {
  if constexpr (kCopiesInputs<E>) {
    const int with = Cfg::smem_bytes + Prefetch<Cfg>::bytes;
    if (static_cast<std::size_t>(with) <= smem_per_block_optin) return with;
  }
  return Cfg::smem_bytes;
}

template <class Cfg, class E>
void allow(std::size_t smem_per_block_optin) {
  allow_shared_memory<Cfg, E>(smem_bytes_with_prefetch<Cfg, E>(smem_per_block_optin), smem_per_block_optin);
}

// Queries the current device and raises every fused kernel's shared-memory limit the first time it
// is seen; afterwards only reads the cache, so captured launches stay cheap and legal.
DeviceLimits current_device_limits() {
  return cached_per_device([](int device) {
    const DeviceLimits limits = ch02::block::query_device_limits(device);
    const std::size_t optin = limits.smem_per_block_optin;
    for_each_tile_config([&](auto cfg) {
      using Cfg = decltype(cfg);
      allow<Cfg, BiasActivationResidual>(optin);
      if constexpr (residual_rows_split_the_tile<Cfg>) allow<Cfg, BiasActivation>(optin);
      allow<Cfg, SwiGlu>(optin);
    });
    allow<SmallDeepTile, RegisterBiasActivationResidual<Activation::none>>(optin);
    allow<SmallDeepTile, RegisterBiasActivationResidual<Activation::relu>>(optin);
    allow<SmallDeepTile, RegisterBiasActivationResidual<Activation::gelu_erf>>(optin);
    allow<SmallDeepTile, RegisterBiasActivationResidual<Activation::gelu_tanh>>(optin);
    allow<SmallDeepTile, RegisterBiasActivationResidual<Activation::silu>>(optin);
    return limits;
  });
}

template <class Cfg, class E>
void launch(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, bool paired,
            const E& epilogue, std::size_t smem_per_block_optin, cudaStream_t stream) {
  if constexpr (std::is_same_v<E, BiasActivationResidual> && residual_rows_split_the_tile<Cfg>) {
    if (epilogue.residual == nullptr) {  // the whole tile staged at once: BiasActivation's kernel
      launch<Cfg>(a, w, c, shape, paired, BiasActivation{epilogue}, smem_per_block_optin, stream);
      return;
    }
  }
  E e = epilogue;
  int smem = Cfg::smem_bytes;
  // Copy the residual and bias early when there is something to fetch, the fast path applies, and
  // the extra shared memory fits (small and narrow tiles everywhere but the 99 KiB parts, medium on
  // sm_80 / sm_90; never the large tile). The register epilogue always reads the area.
  const bool wanted = kInRegisters<E> || e.bias != nullptr || e.residual != nullptr;
  const int with = smem_bytes_with_prefetch<Cfg, E>(smem_per_block_optin);
  if (e.vector && wanted && with > Cfg::smem_bytes) {
    e.prefetched = true;
    smem = with;
  }
  launch_tiles<Cfg>(a, w, c, shape, paired, e, smem, stream);
}

// The launch path after validation: no allocation, no synchronisation.
template <class E>
void run(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape, GemmBf16Tile tile,
         const DeviceLimits& limits, cudaStream_t stream, const E& epilogue) {
  const ch02::GemmBf16TileInfo info = ch02::gemm_bf16_tile_info(tile, limits.smem_per_block_optin);
  if (!info.fits) {
    throw InvalidArgument(std::string("tile ") + ch02::to_string(tile) + " needs " + std::to_string(info.smem_bytes) +
                          " bytes of shared memory per block; this GPU allows " +
                          std::to_string(limits.smem_per_block_optin));
  }
  // bf16x2 stores need 4-byte aligned pairs: N even and c itself 4-byte aligned.
  const bool paired = shape.n % 2 == 0 && aligned_to(c, 4);
  with_tile_config(tile, limits.smem_per_block_optin, [&](auto cfg) {
    launch<decltype(cfg)>(a, w, c, shape, paired, epilogue, limits.smem_per_block_optin, stream);
  });
  check_launch();
}

// The small-deep tile with bias, activation and residual applied in registers
// (RegisterBiasActivationResidual): the kernel of `epilogue.activation`.
void run_small_deep_in_registers(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                                 const Epilogue& epilogue, bool vector, const DeviceLimits& limits,
                                 cudaStream_t stream) {
  const bool paired = shape.n % 2 == 0 && aligned_to(c, 4);  // as run()
  const int n = static_cast<int>(shape.n);
  const auto go = [&](auto activation) {
    const RegisterBiasActivationResidual<decltype(activation)::value> e{epilogue.bias, epilogue.residual, n, vector};
    launch<SmallDeepTile>(a, w, c, shape, paired, e, limits.smem_per_block_optin, stream);
  };
  switch (epilogue.activation) {
    case Activation::none: go(std::integral_constant<Activation, Activation::none>{}); break;
    case Activation::relu: go(std::integral_constant<Activation, Activation::relu>{}); break;
    case Activation::gelu_erf: go(std::integral_constant<Activation, Activation::gelu_erf>{}); break;
    case Activation::gelu_tanh: go(std::integral_constant<Activation, Activation::gelu_tanh>{}); break;
    case Activation::silu: go(std::integral_constant<Activation, Activation::silu>{}); break;
  }
  check_launch();
}

// Picks the epilogue struct for `epilogue` and runs it.
void run_fused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
               const Epilogue& epilogue, GemmBf16Tile tile, const DeviceLimits& limits, cudaStream_t stream) {
  // The staged epilogue's fast path: 16-byte cp.async of bias and residual rows, 8-byte stores.
  const bool vector =
      shape.n % 8 == 0 && aligned_to(c, 16) && aligned_to(epilogue.bias, 16) && aligned_to(epilogue.residual, 16);
  const int n = static_cast<int>(shape.n);
  if (epilogue.swiglu) {
    run(a, w, c, shape, tile, limits, stream, SwiGlu{epilogue.bias, nullptr, n, vector});
  } else if (tile == GemmBf16Tile::small_deep && gemm_bf16_tile_info(tile, limits.smem_per_block_optin).fits &&
             vector &&
             smem_bytes_with_prefetch<SmallDeepTile, RegisterBiasActivationResidual<Activation::none>>(
                 limits.smem_per_block_optin) > SmallDeepTile::smem_bytes) {
    // The register epilogue reads bias and residual from the Prefetch area only: 16-byte aligned
    // rows that fit beside the pipeline. Anything else takes the staged epilogue below.
    run_small_deep_in_registers(a, w, c, shape, epilogue, vector, limits, stream);
  } else {
    run(a, w, c, shape, tile, limits, stream,
        BiasActivationResidual{epilogue.bias, epilogue.residual, n, epilogue.activation, vector});
  }
}

}  // namespace

const char* to_string(Activation activation) {
  switch (activation) {
    case Activation::none: return "none";
    case Activation::relu: return "relu";
    case Activation::gelu_erf: return "gelu_erf";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
  }
  return "unknown";
}

void validate_linear_fused(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                           const Epilogue& epilogue) {
  const auto activation = static_cast<int>(epilogue.activation);
  if (activation < 0 || activation > static_cast<int>(Activation::silu)) {
    throw InvalidArgument("epilogue.activation (" + std::to_string(activation) + ") is not an Activation");
  }
  if (epilogue.swiglu) {
    ch02::validate_gemm_shape(shape);
    if (shape.n % 2 != 0) {
      throw InvalidArgument("shape.n (" + std::to_string(shape.n) +
                            ") must be even in SwiGLU mode (interleaved gate/up rows)");
    }
    if (epilogue.activation != Activation::silu) {
      throw InvalidArgument(std::string("epilogue.activation (") + to_string(epilogue.activation) +
                            ") must be silu in SwiGLU mode");
    }
    if (epilogue.residual != nullptr) throw InvalidArgument("epilogue.residual must be null in SwiGLU mode");
    if (epilogue.bias != nullptr && !aligned_to(epilogue.bias, 4)) {
      throw InvalidArgument("epilogue.bias must be 4-byte aligned in SwiGLU mode (read as gate/up pairs)");
    }
  }
  const std::int64_t c_columns = epilogue_output_columns(shape, epilogue);
  ch02::validate_gemm_bf16_operands(a, w, c, shape, c_columns);
  const std::uint64_t bf16 = sizeof(__nv_bfloat16);
  const auto c_bytes = static_cast<std::uint64_t>(shape.m) * static_cast<std::uint64_t>(c_columns) * bf16;
  if (epilogue.bias != nullptr) {
    if (!aligned_to(epilogue.bias, bf16)) throw InvalidArgument("epilogue.bias must be 2-byte aligned");
    // Every block reads the bias while others write C.
    if (overlaps(c, c_bytes, epilogue.bias, static_cast<std::uint64_t>(shape.n) * bf16)) {
      throw InvalidArgument("epilogue.bias must not overlap c");
    }
  }
  if (epilogue.residual != nullptr) {
    if (!aligned_to(epilogue.residual, bf16)) throw InvalidArgument("epilogue.residual must be 2-byte aligned");
    // The same element is read and written by one thread, in that order; a shifted overlap would
    // let a thread read an element another thread has already overwritten.
    if (epilogue.residual != c && overlaps(c, c_bytes, epilogue.residual, c_bytes)) {
      throw InvalidArgument("epilogue.residual must be c itself or not overlap c at all");
    }
  }
}

void linear_fused(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                  const Epilogue& epilogue, cudaStream_t stream) {
  validate_linear_fused(a, w, c, shape, epilogue);
  const DeviceLimits limits = current_device_limits();
  const GemmBf16Tile tile = ch02::choose_gemm_bf16_tile(shape, limits.sm_count, limits.smem_per_block_optin);
  run_fused(a, w, c, shape, epilogue, tile, limits, stream);
}

void linear_fused_with_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                            const Epilogue& epilogue, GemmBf16Tile tile, cudaStream_t stream) {
  validate_linear_fused(a, w, c, shape, epilogue);
  run_fused(a, w, c, shape, epilogue, tile, current_device_limits(), stream);
}

}  // namespace kc::ch03
