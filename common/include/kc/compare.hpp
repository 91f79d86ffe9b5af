/// @file compare.hpp
/// @brief Comparing a result with an fp64 reference: relative Frobenius error, max abs error,
/// NaN/Inf mismatches, and elements a kernel never wrote (detected through poisoning).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>

namespace kc {

/// Widening conversions used by the comparison and the fp64 references.
inline double to_double(float v) { return v; }
/// Identity, so templates can widen any element type.
inline double to_double(double v) { return v; }
/// Widens an int32 (expert ids, counts) to double.
inline double to_double(int v) { return v; }
/// Widens a bf16 to double (exactly: every bf16 is a double).
inline double to_double(__nv_bfloat16 v) { return static_cast<double>(__bfloat162float(v)); }

/// The outcome of comparing a result with its reference.
struct Comparison {
  std::size_t count = 0;                 ///< elements compared
  double rel_frobenius = 0.0;            ///< ||got - ref||_F / ||ref||_F over finite reference elements
  double max_abs_error = 0.0;            ///< largest |got - ref| over finite reference elements
  std::size_t max_abs_index = 0;         ///< where max_abs_error occurs
  std::size_t nonfinite_mismatches = 0;  ///< got NaN/Inf where ref differs (a NaN never passes)
  std::size_t unwritten = 0;             ///< elements still holding the poison bit pattern
  std::size_t first_bad_index = 0;       ///< first non-finite mismatch or unwritten element

  /// True when nothing is unwritten, no non-finite value is wrong, and rel_frobenius <= @p rel_tol.
  bool passes(double rel_tol) const;
  /// One line for test output: "count=..., rel_frobenius=..., max_abs=... at i, nan/inf=..., unwritten=...".
  std::string summary() const;
};

/// Compares @p got with @p ref element by element.
///
/// Non-finite values: a NaN or Inf in @p got counts as a mismatch unless @p ref holds the same
/// class of value (NaN for NaN, the same infinity), so a NaN in the output never passes by accident.
/// When @p poison_byte is given, an element whose every byte equals it counts as unwritten.
/// @param got the result, copied to the host
/// @param ref the fp64 reference, same length
/// @param poison_byte the byte the output was filled with before the launch, if any
template <typename T>
Comparison compare(std::span<const T> got, std::span<const double> ref,
                   std::optional<unsigned char> poison_byte = std::nullopt);

/// Counts elements of @p data whose every byte equals @p poison_byte (for guard regions).
template <typename T>
std::size_t count_poisoned(std::span<const T> data, unsigned char poison_byte);

}  // namespace kc
