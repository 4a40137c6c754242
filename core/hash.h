// A fast 64-bit hash of plain data (multiply-rotate over 8-byte words):
// fingerprints that tell equal things apart at odds of about 2^-64 a pair.
// Not for adversarial input, not stable across builds with other layouts.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

class Hash64 {
 public:
  void Add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (; bytes >= 8; bytes -= 8, p += 8) {
      uint64_t word;
      std::memcpy(&word, p, 8);
      Mix(word);
    }
    if (bytes > 0) {
      uint64_t word = 0;
      std::memcpy(&word, p, bytes);
      Mix(word ^ (static_cast<uint64_t>(bytes) << 59));  // the tail's length: "a" and "a\0" differ
    }
  }
  // A value of up to 8 bytes is one word, mixed in place (the same hash as
  // through the loop above, without its call: the lowering hashes millions
  // of ids and versions per search proposal).
  template <typename T>
  void Add(const T& value) {
    if constexpr (sizeof(T) <= 8 && std::is_trivially_copyable_v<T>) {
      uint64_t word = 0;
      std::memcpy(&word, &value, sizeof(T));
      Mix(sizeof(T) == 8 ? word : word ^ (static_cast<uint64_t>(sizeof(T)) << 59));
    } else {
      Add(&value, sizeof(value));
    }
  }
  // A contiguous container's values (std::vector, InlineVector), and its size.
  template <typename C>
  void AddAll(const C& values) {
    Add(values.size());
    if (!values.empty()) Add(values.data(), values.size() * sizeof(*values.data()));
  }
  void AddString(const std::string& s) {
    Add(s.size());
    Add(s.data(), s.size());
  }
  uint64_t value() const { return h_ ^ (h_ >> 29); }

 private:
  void Mix(uint64_t word) {
    h_ = (h_ ^ (word * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    h_ = (h_ << 27) | (h_ >> 37);
  }
  uint64_t h_ = 0x243F6A8885A308D3ull;
};

}  // namespace loom
