/// @file gemm_bf16_mainloop.cuh
/// @brief The main loop of the tensor-core GEMM: one block's K loop, C = A · Wᵀ (bf16 in, fp32
/// accumulate) with mma.sync, ldmatrix and a cp.async pipeline, ending in the block's fp32
/// accumulators; and the epilogue hook, through which those accumulators leave. Device code only.
///
/// One mma.sync m16n8k16 makes a whole warp multiply a 16×16 piece of A by a 16×8 piece of W and
/// add it into a 16×8 fp32 tile: 2048 multiply-adds in one instruction. Everything in this file
/// exists to feed that instruction fast enough.
///
/// Who holds what (g = lane / 4, t = lane % 4; mma_sm80.cuh draws it element by element):
///   A fragment, 4 registers of 2 bf16: rows g and g+8 of the 16×16 piece, columns 2t, 2t+1, 2t+8, 2t+9.
///   B fragment, 2 registers: column g of the 16×8 piece (= row g of W), k = 2t, 2t+1, 2t+8, 2t+9.
///   Accumulator, 4 fp32: rows g and g+8, columns 2t and 2t+1.
/// Both fragments want pairs of neighbouring k in one register. A is [M, K] and W is [N, K], both
/// K-major, so a pair of neighbouring k is one aligned 4-byte word in either matrix: ldmatrix (without
/// .trans) produces both fragments straight from shared memory. That is why nn.Linear's layout is
/// the natural one for mma.
///
/// The pipeline (global → shared), kStages buffers of one 64-wide K slice of A and W each:
///   cp.async copies 16 bytes global → shared without passing through registers and without making
///   the thread wait. Each thread commits one group of copies per K slice; cp.async.wait_group<S-2>
///   then means "the oldest slice has landed (my part of it)", and the __syncthreads() after it makes
///   every thread's part visible. While the warps multiply slice kt, slices kt+1 … kt+S-2 are in
///   flight and slice kt+S-1 is being issued into the buffer slice kt-1 used:
///
///     buffer:    0        1        2        3         (S = 4)
///              [kt  ]   [kt+1]   [kt+2]   [kt+3 ← issuing now, overwrites kt-1]
///               mma     landing  landing
///
///   One __syncthreads() per slice does two jobs: slice kt+1 is visible, and every warp has finished
///   reading slice kt, whose buffer the next iteration's copy overwrites.
///
/// Registers are double-buffered too: while the mma of k16 step kk run, the ldmatrix of step kk+1
/// are already in flight, so the tensor cores do not wait for shared memory.
///
/// The epilogue hook: the main loop ends with every thread holding its accumulators (acc[mt][nt][4]
/// for m16 tile mt and n8 tile nt of its warp) and hands them to the Epilogue, a small struct with
///
///   template <class Cfg, class Acc>
///   __device__ void store(Acc& acc, const BlockTile& tile, unsigned char* smem) const;
///
/// which stores them (gemm_bf16_store.cuh holds the plain bf16 stores: from registers, and staged
/// through shared memory). By then the pipeline's shared memory (`smem`) is free for the epilogue.
/// An epilogue that reads inputs of its own may also have the main loop start their copies into
/// shared memory early, so that they have landed when it needs them: it declares
/// `static constexpr InputCopies input_copies`, a run-time `bool prefetched` (copy or not, decided at
/// launch) and `template <class Cfg> __device__ void copy_inputs(smem, block_row0, block_col0,
/// rows_left, cols_left) const`, which issues cp.async copies (the main loop commits them).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "gemm_bf16_tile.cuh"
#include "mma_sm80.cuh"

namespace kc::ch02::block {

using sm80::cp_async_16;
using sm80::cp_async_commit;
using sm80::cp_async_wait;
using sm80::ldmatrix_x4;
using sm80::mma_bf16_16816;
using sm80::shared_address;

/// Where the epilogue stores one block's tile: C's pointer and row length, the tile's place in C,
/// and this thread's warp's place in the tile.
struct BlockTile {
  __nv_bfloat16* c;  ///< C, row-major
  int n;             ///< elements from one row of C to the next
  int row0;          ///< the tile's first row in C
  int col0;          ///< the tile's first column in C
  int rows_left;     ///< rows of C from row0 on (at least 1; more than the tile is fine)
  int cols_left;     ///< columns of C from col0 on (at least 1)
  bool paired;       ///< N even and c 4-byte aligned: two neighbouring outputs are one bf16x2 store
  int warp_row0;     ///< this warp's first row within the tile
  int warp_col0;     ///< this warp's first column within the tile
};

/// When the main loop starts an epilogue's input copies (Epilogue::input_copies; none by default).
enum class InputCopies {
  none,              ///< the epilogue reads nothing of its own, or reads it itself
  at_start,          ///< before the first slices: landed long before the epilogue runs
  with_last_slices,  ///< once the last slice is issued: out of the way of the pipeline's start-up
};

/// Epilogue::input_copies where the epilogue declares it, else InputCopies::none.
template <class Epilogue>
inline constexpr InputCopies input_copies_of = InputCopies::none;
/// An epilogue that declares input_copies: its own answer.
template <class Epilogue>
requires requires { Epilogue::input_copies; }
inline constexpr InputCopies input_copies_of<Epilogue> = Epilogue::input_copies;

/// One block's tile of C = epilogue(A · Wᵀ) over the 64-wide K slices [@p k_tile_begin,
/// @p k_tile_end) (0 <= begin < end <= ceil(k / 64)). The tile's first row and column in C are
/// @p block_row0 and @p block_col0; A's rows and W's rows (C's columns) of the tile are
/// A[block_row0 ...] and W[block_col0 ...]. @p rows_left and @p cols_left say how many of them exist
/// from there on (at least 1 each; more than the tile is fine): rows past them are zero-filled and
/// never stored. C's rows are @p n elements apart; @p paired as in BlockTile. Every thread of the
/// block must call it, with Cfg::smem_bytes of dynamic shared memory (plus what the epilogue's
/// input copies need).
template <class Cfg, class Epilogue>
__device__ __forceinline__ void gemm_bf16_block_k_range(const __nv_bfloat16* __restrict__ a,
                                                        const __nv_bfloat16* __restrict__ w,
                                                        __nv_bfloat16* __restrict__ c, int n, int k, int block_row0,
                                                        int block_col0, int rows_left, int cols_left, bool paired,
                                                        const Epilogue& epilogue, int k_tile_begin, int k_tile_end) {
  constexpr int kThreads = Cfg::threads;
  constexpr int kStages = Cfg::stages;
  constexpr int kMTiles = Cfg::warp_m / 16;  // m16 tiles per warp
  constexpr int kNTiles = Cfg::warp_n / 8;   // n8 tiles per warp
  constexpr int kKSteps = kBlockK / 16;      // k16 steps per stage
  static_assert(kNTiles % 2 == 0, "one ldmatrix.x4 loads the B fragments of two n8 tiles");
  static_assert(kKSteps % 2 == 0, "fragment buffers alternate 0, 1, 0, 1 across stages");

  extern __shared__ __align__(128) unsigned char smem[];
  const std::uint32_t smem_base = shared_address(smem);  // stage s: A slice, then W slice

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 32;
  const int warp = tid / 32;
  const __nv_bfloat16* a_block = a + static_cast<std::int64_t>(block_row0) * k;
  const __nv_bfloat16* w_block = w + static_cast<std::int64_t>(block_col0) * k;

  // This warp's piece of the block tile.
  const int warp_row0 = warp / Cfg::warps_n * Cfg::warp_m;
  const int warp_col0 = warp % Cfg::warps_n * Cfg::warp_n;

  const SliceCopy<Cfg::block_m, kThreads> a_copy(a_block, rows_left, k, tid);
  const SliceCopy<Cfg::block_n, kThreads> w_copy(w_block, cols_left, k, tid);
  // The zero-filled copies need some valid address: the matrices' first elements, which live in
  // the kernel's parameter space. Passing a_block / w_block instead costs two 64-bit registers
  // each for the whole loop, and ptxas then recomputes the copies' addresses every slice (the
  // small tile's loop grows from 157 to 169 instructions, its 128 x 4096 x 7168 GEMM ~25 % slower).
  const int k_tiles = k_tile_end - k_tile_begin;  // slices of this call; k_tile below counts from k_tile_begin
  int k_rotation = 0;                             // slice the loop starts at (Cfg::rotate_k)
  if constexpr (Cfg::rotate_k) {
    const std::int64_t tiles_n = (n + Cfg::block_n - 1) / Cfg::block_n;
    k_rotation = static_cast<int>(static_cast<std::int64_t>(block_col0 / Cfg::block_n) * k_tiles / tiles_n);
  }
  auto issue_copies = [&](int stage, int k_tile) {
    const std::uint32_t stage_base = smem_base + stage * Cfg::stage_bytes;
    int slice = k_tile;
    if constexpr (Cfg::rotate_k)
      slice = k_tile + k_rotation < k_tiles ? k_tile + k_rotation : k_tile + k_rotation - k_tiles;
    a_copy.issue(stage_base, (k_tile_begin + slice) * kBlockK, k, a);
    w_copy.issue(stage_base + Cfg::block_m * kRowBytes, (k_tile_begin + slice) * kBlockK, k, w);
  };

  // This lane's ldmatrix row for k16 step 0. A, one m16 tile: lanes 0-15 give rows 0-15 at k 0-7,
  // lanes 16-31 the same rows at k 8-15, so the four 8×8 matrices arrive as a[0..3] in mma's order.
  // W, two n8 tiles: lanes 0-7 give rows n 0-7 at k 0-7 (b[0] of the first tile), lanes 8-15 the
  // same rows at k 8-15 (its b[1]), lanes 16-31 the same for rows n 8-15 (the second tile).
  // Further m16 tiles and n8 pairs are 16 rows further on: a multiple of 8 rows, so the same swizzle.
  const std::uint32_t a_frag_offset = swizzled(warp_row0 + lane % 16, lane / 16);
  const std::uint32_t w_frag_offset =
      Cfg::block_m * kRowBytes + swizzled(warp_col0 + lane % 8 + lane / 16 * 8, lane / 8 % 2);

  std::uint32_t a_frag[2][kMTiles][4];
  std::uint32_t b_frag[2][kNTiles][2];
  float acc[kMTiles][kNTiles][4] = {};

  auto load_fragments = [&](int buffer, int stage, int kk) {
    // Step kk reads chunk 2·kk + c where step 0 read chunk c (c = 0 or 1). 2·kk and c share no
    // bits, so that is the step-0 offset with the chunk bits XOR-ed by 2·kk: offset ^ (kk << 5).
    const std::uint32_t stage_base = smem_base + stage * Cfg::stage_bytes;
    const std::uint32_t a_row = stage_base + (a_frag_offset ^ (kk << 5));
    const std::uint32_t w_row = stage_base + (w_frag_offset ^ (kk << 5));
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) ldmatrix_x4(a_frag[buffer][mt], a_row + mt * 16 * kRowBytes);
#pragma unroll
    for (int pair = 0; pair < kNTiles / 2; ++pair) {
      std::uint32_t r[4];
      ldmatrix_x4(r, w_row + pair * 16 * kRowBytes);
      b_frag[buffer][2 * pair][0] = r[0];
      b_frag[buffer][2 * pair][1] = r[1];
      b_frag[buffer][2 * pair + 1][0] = r[2];
      b_frag[buffer][2 * pair + 1][1] = r[3];
    }
  };

  // Prologue: slices 0 … S-2 in flight. Every thread commits exactly one group per slice, empty
  // ones included, so "S-2 groups may still be pending" means "slice 0 landed", and in the loop
  // "slice kt+1 landed".
  constexpr int kPrologue = kStages - 1;
  if constexpr (input_copies_of<Epilogue> == InputCopies::at_start) {
    // One more group, older than every slice's: the first wait below covers it too.
    if (epilogue.prefetched) {
      epilogue.template copy_inputs<Cfg>(smem, block_row0, block_col0, rows_left, cols_left);
      cp_async_commit();
    }
  }
  for (int s = 0; s < kPrologue; ++s) {
    if (s < k_tiles) issue_copies(s, s);
    cp_async_commit();
  }
  cp_async_wait<kPrologue - 1>();
  __syncthreads();
  load_fragments(0, 0, 0);

  int read_stage = 0;             // buffer holding slice kt
  int write_stage = kStages - 1;  // buffer the next copies go to: the one slice kt-1 used
  // An epilogue whose inputs are copied with the last slices (InputCopies::with_last_slices) has
  // them issued once every slice is, with the last kPrologue slices still to multiply: the copies
  // join the next group, otherwise empty, which the loop's last iteration waits for, behind its
  // barrier. Copied in the prologue instead, they share the first slices' start-up, when every block
  // waits for memory at once. The K loop therefore runs in two parts with the copies between them,
  // not with a branch inside it: with the branch, ptxas inlines the copies into the loop and
  // schedules it anew.
  constexpr bool kLateCopies = input_copies_of<Epilogue> == InputCopies::with_last_slices;
  constexpr int kParts = kLateCopies ? 2 : 1;
  const int first_part_end = kParts == 2 && k_tiles > kPrologue ? k_tiles - kPrologue : 0;
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    const int part_begin = part == 0 ? 0 : first_part_end;
    const int part_end = part + 1 < kParts ? first_part_end : k_tiles;
    for (int kt = part_begin; kt < part_end; ++kt) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        if (kk == kKSteps - 1) {
          // The next slice's fragments come next: it must have landed, for every thread's copies. The
          // same barrier tells the next copies (issued at the next kk == 0) that every warp has read
          // this slice (its last fragments were loaded at the previous kk), so its buffer can be
          // refilled.
          cp_async_wait<kStages - 2>();
          __syncthreads();
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
        }
        load_fragments((kk + 1) % 2, read_stage, (kk + 1) % kKSteps);

        // Slice kt+S-1 into the buffer slice kt-1 used.
        if (kk == 0) {
          const int next = kt + kStages - 1;
          if (next < k_tiles) issue_copies(write_stage, next);
          cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }

        const int cur = kk % 2;
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) {
            // Serpentine order: the first mma of a row reuses the B fragment of the last one.
            const int nt = mt % 2 == 0 ? j : kNTiles - 1 - j;
            mma_bf16_16816(acc[mt][nt], a_frag[cur][mt], b_frag[cur][nt]);
          }
        }
      }
    }
    if constexpr (kLateCopies) {
      if (part == 0 && epilogue.prefetched) {
        epilogue.template copy_inputs<Cfg>(smem, block_row0, block_col0, rows_left, cols_left);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups can be left; leave nothing in flight at exit
  if constexpr (kLateCopies) {
    // A K loop of fewer than kPrologue slices ends before the wait that covers the copies' group.
    if (k_tiles < kPrologue) __syncthreads();
  }
  epilogue.template store<Cfg>(
      acc, BlockTile{c, n, block_row0, block_col0, rows_left, cols_left, paired, warp_row0, warp_col0}, smem);
}

/// One block's tile of C = epilogue(A · Wᵀ) over the whole of K: gemm_bf16_block_k_range over every
/// 64-wide K slice. See gemm_bf16_block_k_range for the parameters.
template <class Cfg, class Epilogue>
__device__ __forceinline__ void gemm_bf16_block(const __nv_bfloat16* __restrict__ a,
                                                const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ c,
                                                int n, int k, int block_row0, int block_col0, int rows_left,
                                                int cols_left, bool paired, const Epilogue& epilogue) {
  // k >= 1; (k + 63) / 64 could overflow int.
  gemm_bf16_block_k_range<Cfg>(a, w, c, n, k, block_row0, block_col0, rows_left, cols_left, paired, epilogue, 0,
                               (k - 1) / kBlockK + 1);
}

}  // namespace kc::ch02::block
