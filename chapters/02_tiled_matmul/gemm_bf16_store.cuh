/// @file gemm_bf16_store.cuh
/// @brief The plain epilogues of the tensor-core GEMM: each fp32 accumulator rounded once to bf16
/// and stored, either straight from registers (NoEpilogue) or staged through shared memory
/// (StagedStore), and the staged store's loop, which an epilogue with inputs of its own (a vector
/// over C's columns, a matrix shaped like C) can reuse. Device code only.
///
/// From registers, a thread stores its pairs of neighbouring columns: a warp's store instruction
/// writes 16 bytes in each of 8 rows of C. Staged, the accumulators go through shared memory (the
/// pipeline's buffers are free by then) to a short loop, the same few hundred instructions for every
/// group of outputs:
///   1. every warp writes its fp32 accumulators into a row-major tile (rows padded by 8 floats so
///      that the four rows a half-warp writes start 8 banks apart: no conflicts);
///   2. an epilogue's inputs for the tile (`bias`: one per column of C; `residual`: shaped like C)
///      are copied in with cp.async at the same time, so the loop never waits on global memory;
///   3. each thread takes 4 neighbouring outputs of a row at a time: one 16-byte shared load, the
///      epilogue's math in fp32 (`finish4`), one 8-byte store; a warp stores 256 contiguous bytes
///      of C.
/// When the staging area does not fit the pipeline's shared memory (the large tile: 128 rows x 264
/// floats + residual rows > 192 KiB), the tile is finished in two halves of rows; without residual
/// rows the large tile's 132 KiB of staged rows fit at once. Odd shapes (N % 8 != 0) and pointers
/// that are not 16-byte aligned take the same loop, but read the inputs element by element from
/// global memory and store element by element (`finish_each`).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "gemm_bf16_mainloop.cuh"

namespace kc::ch02::block {

/// Stores two neighbouring outputs (columns col, col+1 of one row), rounded to nearest-even bf16.
/// `room` is how many columns are left in the row from col on. One 4-byte store when both fit and
/// the address is 4-byte aligned (N even and c aligned: `paired`), element by element otherwise.
__device__ __forceinline__ void store_pair(__nv_bfloat16* out, float x, float y, int room, bool paired) {
  if (paired && room >= 2) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(x, y);
    return;
  }
  if (room >= 1) out[0] = __float2bfloat16_rn(x);
  if (room >= 2) out[1] = __float2bfloat16_rn(y);
}

/// Calls @p store(out, x, y, row, col) for each pair of neighbouring accumulators this thread holds
/// whose row and first column lie in C: acc[mt][nt] holds rows g and g+8, columns 2t and 2t+1 of the
/// 16×8 tile at (warp_row0 + 16·mt, warp_col0 + 8·nt), and `out` points at C's element (row, col).
/// The four lanes of a row write 16 contiguous bytes, the eight n8 tiles of a warp a 128-byte row.
template <class Cfg, class Acc, class StorePair>
__device__ __forceinline__ void for_each_pair(const Acc& acc, const BlockTile& t, StorePair store) {
  constexpr int kMTiles = Cfg::warp_m / 16;
  constexpr int kNTiles = Cfg::warp_n / 8;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  __nv_bfloat16* c_block = t.c + static_cast<std::int64_t>(t.row0) * t.n + t.col0;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = t.warp_row0 + 16 * mt + lane / 4 + 8 * half;
      if (row >= t.rows_left) continue;
      __nv_bfloat16* c_row = c_block + static_cast<std::int64_t>(row) * t.n;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) {
        const int col = t.warp_col0 + 8 * nt + 2 * (lane % 4);
        if (col >= t.cols_left) continue;
        store(c_row + col, acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1], row, col);
      }
    }
  }
}

/// The plain store from registers: each pair of accumulators rounded and stored by the thread that
/// holds it.
struct NoEpilogue {
  /// Stores the block's accumulators into C (the epilogue hook, gemm_bf16_mainloop.cuh).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char*) const {
    for_each_pair<Cfg>(acc, t, [&](__nv_bfloat16* out, float x, float y, int, int col) {
      store_pair(out, x, y, t.cols_left - col, t.paired);
    });
  }
};

/// Where the staged epilogue keeps things in shared memory, for a tile configuration Cfg; with
/// kResidualRows false (an epilogue that never reads a residual, StagedStore) no residual rows are
/// kept beside the accumulators, so a larger part of the tile fits at once.
template <class Cfg, bool kResidualRows = true>
struct Staging {
  static constexpr int acc_ld = Cfg::block_n + 8;                                  ///< floats per staged row
  static constexpr int acc_row_bytes = acc_ld * 4;                                 ///< bytes per staged row
  static constexpr int residual_row_bytes = kResidualRows ? Cfg::block_n * 2 : 0;  ///< bytes per residual row
  static constexpr int bias_bytes = Cfg::block_n * 2;                              ///< the tile's bias (bf16)
  /// Shared memory for @p rows staged rows with their residual rows, and the bias.
  static constexpr int bytes_for(int rows) { return rows * (acc_row_bytes + residual_row_bytes) + bias_bytes; }
  /// Rows finished per part: the whole tile, or half of it when that does not fit.
  static constexpr int part_rows = bytes_for(Cfg::block_m) <= Cfg::smem_bytes ? Cfg::block_m : Cfg::block_m / 2;
  static constexpr int parts = Cfg::block_m / part_rows;                                ///< 1 or 2
  static constexpr int residual_offset = part_rows * acc_row_bytes;                     ///< byte offset
  static constexpr int bias_offset = residual_offset + part_rows * residual_row_bytes;  ///< byte offset
  static constexpr int groups_per_row = Cfg::block_n / 4;                               ///< groups of 4 outputs
  static_assert(bytes_for(part_rows) <= Cfg::smem_bytes, "the staging area fits the pipeline's buffers");
  static_assert(part_rows % Cfg::warp_m == 0, "each warp's rows lie in one part");
};

/// Shared memory an epilogue adds after the pipeline's buffers when its inputs are copied early
/// (InputCopies): the whole tile's residual rows, then its bias, copied by cp.async ahead of time so
/// that they have landed before the epilogue needs them (a copy at the end exposes one memory
/// latency per block, which matters when the grid is a single wave).
template <class Cfg>
struct Prefetch {
  /// bf16 a prefetched residual row: 16 bytes of padding, so that the 8 rows of a warp's pairs (the
  /// same columns), read from registers' positions, start 4 banks apart and are read without conflict.
  static constexpr int residual_ld = Cfg::block_n + 8;
  static constexpr int residual_bytes = Cfg::block_m * residual_ld * 2;  ///< block_m padded rows of bf16
  static constexpr int bias_bytes = Cfg::block_n * 2;                    ///< the tile's bias (bf16)
  static constexpr int bytes = residual_bytes + bias_bytes;              ///< added to Cfg::smem_bytes
  static constexpr int offset = Cfg::smem_bytes;                         ///< residual, then bias
};

/// Four bf16 at @p p (8-byte aligned) as floats, with one 8-byte load.
__device__ __forceinline__ void load4(float (&x)[4], const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  x[0] = lo.x, x[1] = lo.y, x[2] = hi.x, x[3] = hi.y;
}

/// Four floats rounded to bf16 and stored with one 8-byte store at @p out (8-byte aligned).
__device__ __forceinline__ void store4(const float (&x)[4], __nv_bfloat16* out) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x[0], x[1]);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(x[2], x[3]);
  uint2 packed;
  packed.x = *reinterpret_cast<const std::uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const std::uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(out) = packed;
}

/// Starts the copies of the tile's residual rows and bias (where @p epilogue has them) into the
/// Prefetch area (16-byte chunks; the vector path guarantees their alignment). Rows and columns
/// outside C are not copied: the epilogue never reads them.
template <class Cfg, class Epilogue>
__device__ __forceinline__ void copy_epilogue_inputs(const Epilogue& epilogue, unsigned char* smem, int block_row0,
                                                     int block_col0, int rows_left, int cols_left) {
  constexpr int kChunksPerTileRow = Cfg::block_n / 8;
  const int tid = static_cast<int>(threadIdx.x);
  if (epilogue.residual != nullptr) {
    for (int q = tid; q < Cfg::block_m * kChunksPerTileRow; q += Cfg::threads) {
      const int r = q / kChunksPerTileRow, chunk = q % kChunksPerTileRow;
      if (r < rows_left && chunk * 8 < cols_left) {
        const __nv_bfloat16* src =
            epilogue.residual + static_cast<std::int64_t>(block_row0 + r) * epilogue.n + block_col0 + chunk * 8;
        cp_async_16(shared_address(smem + Prefetch<Cfg>::offset + r * Prefetch<Cfg>::residual_ld * 2 + chunk * 16), src,
                    true);
      }
    }
  }
  if (epilogue.bias != nullptr) {
    for (int chunk = tid; chunk < kChunksPerTileRow; chunk += Cfg::threads) {
      if (chunk * 8 < cols_left) {
        cp_async_16(shared_address(smem + Prefetch<Cfg>::offset + Prefetch<Cfg>::residual_bytes + chunk * 16),
                    epilogue.bias + block_col0 + chunk * 8, true);
      }
    }
  }
}

/// False for staged epilogues that never read a residual and say so (StagedStore::residual_rows).
template <class Epilogue>
inline constexpr bool stages_residual_rows = true;
/// An epilogue that declares residual_rows: its own answer.
template <class Epilogue>
requires requires { Epilogue::residual_rows; }
inline constexpr bool stages_residual_rows<Epilogue> = Epilogue::residual_rows;

/// Steps 1-3 above for one block. acc is the main loop's accumulator array; `smem` the pipeline's
/// shared memory, free once every warp has passed the barrier at the top of each part. Epilogue
/// provides `bias`, `residual` (each may be a constant null), `n`, `vector`, `prefetched`,
/// `outputs_per_group` (4, or 2 when 4 accumulators make 2 outputs), `finish4` and `finish_each`.
template <class Cfg, class Epilogue, class Acc>
__device__ __forceinline__ void staged_store(const Acc& acc, const Epilogue& epilogue, unsigned char* smem,
                                             const BlockTile& t) {
  __nv_bfloat16* c = t.c;
  const int block_row0 = t.row0, block_col0 = t.col0, rows_left = t.rows_left, cols_left = t.cols_left;
  const int warp_row0 = t.warp_row0, warp_col0 = t.warp_col0;
  using S = Staging<Cfg, stages_residual_rows<Epilogue>>;
  constexpr int kMTiles = Cfg::warp_m / 16;
  constexpr int kNTiles = Cfg::warp_n / 8;
  constexpr int kChunksPerTileRow = Cfg::block_n / 8;  // 16-byte chunks of a row of bias / residual
  static_assert(Cfg::threads % S::groups_per_row == 0, "the block's threads cover whole staged rows");
  constexpr int kRowsPerStep = Cfg::threads / S::groups_per_row;  // rows the block finishes per step
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  float* staged = reinterpret_cast<float*>(smem);
  // Residual rows and bias: prefetched at the start of the kernel, or copied in below, part by part.
  const auto* residual_base =
      reinterpret_cast<const __nv_bfloat16*>(smem + (epilogue.prefetched ? Prefetch<Cfg>::offset : S::residual_offset));
  const auto* bias_tile = reinterpret_cast<const __nv_bfloat16*>(
      smem + (epilogue.prefetched ? Prefetch<Cfg>::offset + Prefetch<Cfg>::residual_bytes : S::bias_offset));
  const std::int64_t ldc = Epilogue::outputs_per_group == 4 ? epilogue.n : epilogue.n / 2;

#pragma unroll 1
  for (int part = 0; part < S::parts; ++part) {
    const int part_row0 = part * S::part_rows;
    __syncthreads();  // the main loop (or the previous part) is done with shared memory

    // Prefetched rows are indexed from the tile's first row, copied ones from the part's.
    // Prefetched rows are padded (Prefetch::residual_ld); rows copied here are not.
    const int residual_ld = epilogue.prefetched ? Prefetch<Cfg>::residual_ld : Cfg::block_n;
    const __nv_bfloat16* residual_tile = residual_base + (epilogue.prefetched ? part_row0 * residual_ld : 0);
    if (epilogue.vector && !epilogue.prefetched) {
      if (epilogue.residual != nullptr) {
        for (int q = tid; q < S::part_rows * kChunksPerTileRow; q += Cfg::threads) {
          const int r = q / kChunksPerTileRow, chunk = q % kChunksPerTileRow;
          if (part_row0 + r < rows_left && chunk * 8 < cols_left) {
            const __nv_bfloat16* src = epilogue.residual +
                                       static_cast<std::int64_t>(block_row0 + part_row0 + r) * epilogue.n + block_col0 +
                                       chunk * 8;
            cp_async_16(shared_address(smem + S::residual_offset + r * S::residual_row_bytes + chunk * 16), src, true);
          }
        }
      }
      if (part == 0 && epilogue.bias != nullptr) {
        for (int chunk = tid; chunk < kChunksPerTileRow; chunk += Cfg::threads) {
          if (chunk * 8 < cols_left) {
            cp_async_16(shared_address(smem + S::bias_offset + chunk * 16), epilogue.bias + block_col0 + chunk * 8,
                        true);
          }
        }
      }
      cp_async_commit();
    }

    // Step 1: the warps whose rows are in this part write their accumulators: lane (g, t) of an
    // m16n8 tile holds rows g and g+8, columns 2t and 2t+1.
    if (warp_row0 / S::part_rows == part) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = warp_row0 - part_row0 + 16 * mt + lane / 4 + 8 * half;
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) {
            const int col = warp_col0 + 8 * nt + 2 * (lane % 4);
            *reinterpret_cast<float2*>(&staged[r * S::acc_ld + col]) =
                make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();

    // Step 3: groups of 4 accumulators of a row. A block's threads cover kRowsPerStep whole rows
    // at a time (consecutive threads on consecutive groups, so a warp stores contiguous bytes), and
    // a thread keeps the same column group in every row it visits: its input columns are read once,
    // and moving to its next group is a pointer increment, not an index to divide and multiply out
    // again. At 4096^3 the large tile's epilogue has the SM to itself (8 warps on 4 schedulers, one
    // block), so nothing hides its steps: an index per group costs 3 % of the whole GEMM.
    const int col = tid % S::groups_per_row * 4;
    const int first_row = tid / S::groups_per_row;
    const int rows_here = rows_left - part_row0 < S::part_rows ? rows_left - part_row0 : S::part_rows;
    if (col < cols_left) {
      const float* from = staged + first_row * S::acc_ld + col;
      if (epilogue.vector) {  // cols_left is then a multiple of 8: the whole group exists
        float bias4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (epilogue.bias != nullptr) load4(bias4, bias_tile + col);
        const __nv_bfloat16* residual4 = residual_tile + first_row * residual_ld + col;
        __nv_bfloat16* out =
            c + (block_row0 + part_row0 + first_row) * ldc + (block_col0 + col) * Epilogue::outputs_per_group / 4;
#pragma unroll 2  // two groups in flight: the loop is latency-bound at the end of a single-wave grid
        for (int r = first_row; r < rows_here; r += kRowsPerStep) {
          const float4 v = *reinterpret_cast<const float4*>(from);
          float x[4] = {v.x, v.y, v.z, v.w};
          epilogue.finish4(x, bias4, residual4, out);
          from += kRowsPerStep * S::acc_ld;
          residual4 += kRowsPerStep * residual_ld;
          out += kRowsPerStep * ldc;
        }
      } else {
        const int count = cols_left - col < 4 ? cols_left - col : 4;
        for (int r = first_row; r < rows_here; r += kRowsPerStep) {
          const float4 v = *reinterpret_cast<const float4*>(from);
          float x[4] = {v.x, v.y, v.z, v.w};
          epilogue.finish_each(x, count, block_row0 + part_row0 + r, block_col0 + col, c);
          from += kRowsPerStep * S::acc_ld;
        }
      }
    }
  }
}

/// The plain store, staged: nothing added, each accumulator rounded once and stored through shared
/// memory, a warp writing whole 256-byte rows of C (step 3 above) where the store from registers
/// writes 16 bytes in each of 8 rows. With no residual rows to keep, the large tile is staged whole,
/// in one part. The large tile stores the plain GEMM with it.
struct StagedStore {
  /// Asks for input copies like every staged epilogue; with nothing to copy, `prefetched` stays false.
  static constexpr InputCopies input_copies = InputCopies::at_start;
  static constexpr bool residual_rows = false;               ///< Staging keeps no residual rows
  static constexpr int outputs_per_group = 4;                ///< C columns per 4 accumulators
  static constexpr const __nv_bfloat16* bias = nullptr;      ///< none: the staging code's tests fold away
  static constexpr const __nv_bfloat16* residual = nullptr;  ///< none
  int n;                                                     ///< columns of C
  bool vector;                                               ///< n % 8 == 0 and c 16-byte aligned: 8-byte stores
  bool prefetched = false;                                   ///< never: there is nothing to prefetch

  /// The store for C [.., @p n] at @p c: 8-byte stores of whole groups where every row of C starts
  /// 16-byte aligned, else element by element. Host side, at launch.
  static StagedStore for_output(int n, const __nv_bfloat16* c) {
    return StagedStore{n, n % 8 == 0 && reinterpret_cast<std::uintptr_t>(c) % 16 == 0};
  }

  /// Four outputs at (row, col..col+3) of C: rounded, one 8-byte store at @p out.
  __device__ void finish4(float (&x)[4], const float (&)[4], const __nv_bfloat16*, __nv_bfloat16* out) const {
    store4(x, out);
  }

  /// The same element by element, for the `count` outputs that exist.
  __device__ void finish_each(float (&x)[4], int count, std::int64_t row, int col, __nv_bfloat16* c) const {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e < count) c[row * n + col + e] = __float2bfloat16_rn(x[e]);
    }
  }

  /// Issues nothing: there are no inputs (the epilogue hook, gemm_bf16_mainloop.cuh).
  template <class Cfg>
  __device__ void copy_inputs(unsigned char* smem, int block_row0, int block_col0, int rows_left, int cols_left) const {
    copy_epilogue_inputs<Cfg>(*this, smem, block_row0, block_col0, rows_left, cols_left);
  }

  /// Stores the block's accumulators into C through shared memory (the epilogue hook).
  template <class Cfg, class Acc>
  __device__ void store(const Acc& acc, const BlockTile& t, unsigned char* smem) const {
    staged_store<Cfg>(acc, *this, smem, t);
  }
};

}  // namespace kc::ch02::block
