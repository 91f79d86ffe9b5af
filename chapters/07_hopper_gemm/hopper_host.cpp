// Chapter 7's host side: the rules, the step table, the tensor maps and the dispatch. The rules and
// the maps' arithmetic make no CUDA call, so the CPU tests cover them on machines without a GPU.
#include <cstdint>
#include <string>

#include "hopper_gemm.hpp"
#include "hopper_launch.hpp"
#include "hopper_tiles.hpp"
#include "kc/check.hpp"
#include "kc/device_info.hpp"
#include "kc/validate.hpp"

namespace kc::ch07 {

namespace {

TileConfig tile_config(HopperStep step) {
  switch (step) {
    case HopperStep::tma_wgmma: return kStep1Tile;
    case HopperStep::pipeline: return kStep2Tile;
    case HopperStep::warp_specialized: return kStep3Tile;
    case HopperStep::persistent: return kStep4Tile;
    case HopperStep::cluster_multicast: return kStep5Tile;
    case HopperStep::tma_store: return kStep6Tile;
  }
  throw InvalidArgument("step (" + std::to_string(static_cast<int>(step)) + ") is not a HopperStep");
}

std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

// What the launch path needs to know about the current device, queried once per device.
struct DeviceFacts {
  int cc_major = 0;
  int cc_minor = 0;
  std::size_t smem_per_block_optin = 0;
  int sms = 0;
};

DeviceFacts current_device_facts() {
  return cached_per_device([](int device) {
    DeviceFacts facts;
    int optin = 0;
    check(cudaDeviceGetAttribute(&facts.cc_major, cudaDevAttrComputeCapabilityMajor, device));
    check(cudaDeviceGetAttribute(&facts.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
    check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    facts.smem_per_block_optin = static_cast<std::size_t>(optin);
    check(cudaDeviceGetAttribute(&facts.sms, cudaDevAttrMultiProcessorCount, device));
    return facts;
  });
}

}  // namespace

HopperStepInfo hopper_step_info(HopperStep step) {
  const TileConfig t = tile_config(step);
  const bool persistent =
      step == HopperStep::persistent || step == HopperStep::cluster_multicast || step == HopperStep::tma_store;
  HopperStepInfo info;
  info.block_m = t.block_m;
  info.block_n = t.block_n;
  info.block_k = kBlockK;
  info.threads = t.threads();
  info.consumer_warpgroups = t.consumer_warpgroups;
  info.producer_warpgroups = t.producer_warpgroups;
  info.stages = t.stages;
  info.stage_bytes = t.stage_bytes();
  info.smem_bytes = t.smem_bytes();
  info.cluster_m = t.cluster_m;
  info.c_staging_bytes = t.c_staging_bytes();
  info.persistent = persistent;
  return info;
}

const char* to_string(HopperStep step) {
  switch (step) {
    case HopperStep::tma_wgmma: return "step1_tma_wgmma";
    case HopperStep::pipeline: return "step2_pipeline";
    case HopperStep::warp_specialized: return "step3_warp_specialized";
    case HopperStep::persistent: return "step4_persistent";
    case HopperStep::cluster_multicast: return "step5_cluster_multicast";
    case HopperStep::tma_store: return "step6_tma_store";
  }
  return "unknown";
}

std::optional<std::string> hopper_unsupported_reason(int cc_major, int cc_minor) {
  if (cc_major == 9 && cc_minor == 0) return std::nullopt;
  return "Chapter 7's kernels need an sm_90 GPU (H100, H200, GH200): wgmma and setmaxnreg are sm_90a "
         "instructions, and sm_90a code runs on no other architecture; this GPU is sm_" +
         std::to_string(cc_major) + std::to_string(cc_minor);
}

bool hopper_kernels_built() { return detail::kernels_built(); }

std::optional<std::string> hopper_unavailable_reason(int cc_major, int cc_minor) {
  if (auto reason = hopper_unsupported_reason(cc_major, cc_minor)) return reason;
  if (!detail::kernels_built()) return "built without sm_90a kernels (no 90 architecture)";
  return std::nullopt;
}

void require_hopper(const char* chapter, bool kernels_built) {
  if (!kernels_built) {
    throw UnsupportedGpu(std::string(chapter) +
                         " was built without sm_90a kernels: configure with a 90 entry in CMAKE_CUDA_ARCHITECTURES "
                         "(e.g. -DCMAKE_CUDA_ARCHITECTURES=\"80-real;90\") and run on an sm_90 GPU");
  }
  const DeviceFacts device = current_device_facts();
  if (auto reason = hopper_unsupported_reason(device.cc_major, device.cc_minor)) throw UnsupportedGpu(*reason);
}

void validate_gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                               HopperStep step) {
  const TileConfig tile = tile_config(step);
  ch02::validate_gemm_shape(shape);
  if (shape.k % 8 != 0) {
    throw InvalidArgument("shape.k (" + std::to_string(shape.k) +
                          ") must be a multiple of 8 (TMA: rows of a multiple of 16 bytes)");
  }
  if (a == nullptr) throw InvalidArgument("a must not be null");
  if (w == nullptr) throw InvalidArgument("w must not be null");
  if (c == nullptr) throw InvalidArgument("c must not be null");
  if (!kc::aligned_to(a, 16)) {
    throw InvalidArgument("a must be 16-byte aligned (TMA reads from a 16-byte-aligned base)");
  }
  if (!kc::aligned_to(w, 16)) {
    throw InvalidArgument("w must be 16-byte aligned (TMA reads from a 16-byte-aligned base)");
  }
  if (!kc::aligned_to(c, alignof(__nv_bfloat16))) {
    throw InvalidArgument("c must be 2-byte aligned (the alignment of bf16)");
  }
  const std::int64_t tiles = ceil_div(shape.m, tile.block_m) * ceil_div(shape.n, tile.block_n);
  if (tiles > 0x7FFFFFFF) {
    throw InvalidArgument("shape (" + std::to_string(shape.m) + " x " + std::to_string(shape.n) +
                          ") must need at most 2^31 - 1 tiles of " + std::to_string(tile.block_m) + " x " +
                          std::to_string(tile.block_n));
  }
  const auto bytes = [](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) * sizeof(__nv_bfloat16);
  };
  if (kc::overlaps(c, bytes(shape.m, shape.n), a, bytes(shape.m, shape.k)))
    throw InvalidArgument("c must not overlap a");
  if (kc::overlaps(c, bytes(shape.m, shape.n), w, bytes(shape.n, shape.k)))
    throw InvalidArgument("c must not overlap w");
}

bool c_tma_storable(const __nv_bfloat16* c, GemmShape shape) { return kc::aligned_to(c, 16) && shape.n % 8 == 0; }

TensorMapSpec c_store_map(const __nv_bfloat16* c, GemmShape shape) {
  return bf16_row_major_map(c, shape.m, shape.n, kStoreBoxRows);
}

namespace {

// The two maps of a launch on @p tile: A in boxes of block_m rows, W in boxes of w_box_rows().
OperandMaps maps_for_tile(const __nv_bfloat16* a, const __nv_bfloat16* w, GemmShape shape, const TileConfig& tile) {
  return {bf16_row_major_map(a, shape.m, shape.k, tile.block_m),
          bf16_row_major_map(w, shape.n, shape.k, tile.w_box_rows())};
}

void validate_maps(const OperandMaps& maps) {
  validate_tensor_map(maps.a, "a");
  validate_tensor_map(maps.w, "w");
}

}  // namespace

OperandMaps operand_maps(const __nv_bfloat16* a, const __nv_bfloat16* w, GemmShape shape, HopperStep step) {
  return maps_for_tile(a, w, shape, tile_config(step));
}

namespace {

// The launch path of every step and of `after` (@p kernel picks step 6's variant; the other steps
// have one).
void launch_gemm(HopperStep step, detail::Step6Kernel kernel, const __nv_bfloat16* a, const __nv_bfloat16* w,
                 __nv_bfloat16* c, GemmShape shape, cudaStream_t stream, void* workspace = nullptr,
                 std::size_t workspace_bytes = 0) {
  // 1. Everything the host can check, before any CUDA call: the shape and pointer rules, and the maps
  // of the tile this launch runs on.
  validate_gemm_bf16_hopper(a, w, c, shape, step);
  validate_maps(maps_for_tile(a, w, shape, tile_config(step)));
  // 2. Can this build and this GPU run sm_90a code at all?
  require_hopper("Chapter 7", detail::kernels_built());
  const DeviceFacts device = current_device_facts();
  if (kernel == detail::Step6Kernel::stream_k) {
    validate_hopper_workspace(a, w, c, shape, workspace, workspace_bytes, hopper_workspace_bytes(device.sms));
  }
  const TileConfig tile = tile_config(step);
  if (tile.smem_bytes() > device.smem_per_block_optin) {
    throw UnsupportedGpu(std::string(to_string(step)) + " needs " + std::to_string(tile.smem_bytes()) +
                         " bytes of shared memory per block; this GPU allows " +
                         std::to_string(device.smem_per_block_optin));
  }
  // 3. The maps (host-only encoding) and the launch.
  const OperandMaps maps = maps_for_tile(a, w, shape, tile);
  const CUtensorMap a_map = encode_tensor_map(maps.a, "a");
  const CUtensorMap w_map = encode_tensor_map(maps.w, "w");
  const auto n = static_cast<int>(shape.n);
  detail::Output out{c,
                     static_cast<int>(shape.m),
                     n,
                     static_cast<int>(shape.k),
                     static_cast<int>(ceil_div(shape.m, tile.block_m)),
                     static_cast<int>(ceil_div(shape.n, tile.block_n)),
                     n % 2 == 0 && kc::aligned_to(c, 4),
                     tile.c_staging && c_tma_storable(c, shape)};
  const auto tiles = static_cast<int>(static_cast<std::int64_t>(out.tiles_m) * out.tiles_n);
  // Step 6's C map, only when its stores can use it (otherwise the kernel stores from registers).
  const CUtensorMap c_map = out.tma_store ? encode_tensor_map(c_store_map(c, shape), "c") : CUtensorMap{};
  out.workspace = workspace;
  out.workspace_bytes = workspace_bytes;
  switch (step) {
    case HopperStep::tma_wgmma: detail::launch_step1(a_map, w_map, out, tiles, stream); break;
    case HopperStep::pipeline: detail::launch_step2(a_map, w_map, out, tiles, stream); break;
    case HopperStep::warp_specialized: detail::launch_step3(a_map, w_map, out, tiles, stream); break;
    case HopperStep::persistent: detail::launch_step4(a_map, w_map, out, tiles, stream); break;
    case HopperStep::cluster_multicast: detail::launch_step5(a_map, w_map, out, tiles, stream); break;
    case HopperStep::tma_store: detail::launch_step6(kernel, a_map, w_map, c_map, out, tiles, stream); break;
  }
}

}  // namespace

void gemm_bf16_hopper_step(HopperStep step, const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c,
                           GemmShape shape, cudaStream_t stream) {
  launch_gemm(step, detail::Step6Kernel::own, a, w, c, shape, stream);
}

void gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                      cudaStream_t stream) {
  launch_gemm(kAfterStep, detail::Step6Kernel::dependent_launch, a, w, c, shape, stream);
}

std::size_t hopper_workspace_bytes(int sms) {
  if (sms < 2) throw InvalidArgument("sms (" + std::to_string(sms) + ") must be at least 2 (one cluster of two)");
  const int clusters = sms / 2;
  if (clusters > detail::StreamKWorkspace::kMaxClusters) {
    throw InvalidArgument("sms (" + std::to_string(sms) + ") must be at most " +
                          std::to_string(2 * detail::StreamKWorkspace::kMaxClusters) +
                          " (the workspace's flag region has room for that many clusters)");
  }
  return detail::StreamKWorkspace::bytes(clusters);
}

std::size_t gemm_bf16_hopper_workspace_bytes() { return hopper_workspace_bytes(current_device_facts().sms); }

void validate_hopper_workspace(const __nv_bfloat16* a, const __nv_bfloat16* w, const __nv_bfloat16* c, GemmShape shape,
                               const void* workspace, std::size_t workspace_bytes, std::size_t required_bytes) {
  if (workspace == nullptr) throw InvalidArgument("workspace must not be null");
  if (!kc::aligned_to(workspace, 16)) {
    throw InvalidArgument("workspace must be 16-byte aligned (its partial tiles are read as float4)");
  }
  if (workspace_bytes < required_bytes) {
    throw InvalidArgument("workspace_bytes (" + std::to_string(workspace_bytes) + ") must be at least " +
                          std::to_string(required_bytes) + " (gemm_bf16_hopper_workspace_bytes())");
  }
  const auto bytes_of = [](std::int64_t rows, std::int64_t cols) {
    return static_cast<std::uint64_t>(rows * cols) * 2;
  };
  if (kc::overlaps(workspace, workspace_bytes, a, bytes_of(shape.m, shape.k)) ||
      kc::overlaps(workspace, workspace_bytes, w, bytes_of(shape.n, shape.k)) ||
      kc::overlaps(workspace, workspace_bytes, c, bytes_of(shape.m, shape.n))) {
    throw InvalidArgument("workspace must not overlap a, w or c");
  }
}

StreamKPlan gemm_bf16_hopper_stream_k_plan(GemmShape shape) {
  ch02::validate_gemm_shape(shape);
  require_hopper("Chapter 7", detail::kernels_built());
  const auto tiles_m = static_cast<int>(ceil_div(shape.m, kStep6Tile.block_m));
  const auto tiles_n = static_cast<int>(ceil_div(shape.n, kStep6Tile.block_n));
  const int grid = cluster_grid(tiles_m, tiles_n, kStep6Tile.cluster_m, detail::stream_k_resident_clusters());
  return stream_k_plan(cluster_tile_count(tiles_m, tiles_n, kStep6Tile.cluster_m), grid / kStep6Tile.cluster_m,
                       static_cast<int>(ceil_div(shape.k, kBlockK)));
}

void gemm_bf16_hopper(const __nv_bfloat16* a, const __nv_bfloat16* w, __nv_bfloat16* c, GemmShape shape,
                      void* workspace, std::size_t workspace_bytes, cudaStream_t stream) {
  launch_gemm(kAfterStep, detail::Step6Kernel::stream_k, a, w, c, shape, stream, workspace, workspace_bytes);
}

}  // namespace kc::ch07
