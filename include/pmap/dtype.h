// Element types of Arrays: the enum, sizes, names, and the C++ type <-> DType mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace pmap {

enum class DType : std::uint8_t { f32, f64, i32, i64, u32, u8 };

// Bytes per element.
constexpr std::size_t size_of(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

// "f32", "i32", ... (the spelling used in error messages).
constexpr std::string_view name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u32: return "u32";
    case DType::u8: return "u8";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t == DType::f32 || t == DType::f64; }

template <class T> struct dtype_of_t;
template <> struct dtype_of_t<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of_t<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of_t<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of_t<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of_t<std::uint32_t> { static constexpr DType value = DType::u32; };
template <> struct dtype_of_t<std::uint8_t> { static constexpr DType value = DType::u8; };

// dtype_of<float> == DType::f32. Only the six element types above are valid.
template <class T> inline constexpr DType dtype_of = dtype_of_t<std::remove_cv_t<T>>::value;

template <class T> concept Element = requires { dtype_of_t<std::remove_cv_t<T>>::value; };

}  // namespace pmap
