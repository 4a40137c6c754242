// A vector of plain values that holds up to N of them in itself and moves
// to the heap only beyond: a Region's bounds and a task's piece lists are a
// few integers each, and a strategy search makes and moves millions of them
// (a heap block each was a malloc, a free and a cache miss per list).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

template <typename T, size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "InlineVector holds plain values (copied as bytes)");
  static_assert(N > 0, "InlineVector needs room for one value");

 public:
  using value_type = T;
  using size_type = size_t;
  using iterator = T*;
  using const_iterator = const T*;
  using reference = T&;
  using const_reference = const T&;

  InlineVector() = default;
  InlineVector(size_t n, const T& value) { assign(n, value); }
  InlineVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  template <typename It, typename = decltype(*std::declval<It>())>
  InlineVector(It first, It last) {
    assign(first, last);
  }
  InlineVector(const std::vector<T>& v) { assign(v.begin(), v.end()); }  // NOLINT: a drop-in for std::vector
  InlineVector(const InlineVector& o) { assign(o.begin(), o.end()); }
  InlineVector(InlineVector&& o) noexcept { Steal(o); }
  InlineVector& operator=(const InlineVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  InlineVector& operator=(InlineVector&& o) noexcept {
    if (this != &o) {
      Free();
      Steal(o);
    }
    return *this;
  }
  InlineVector& operator=(std::initializer_list<T> values) {
    assign(values.begin(), values.end());
    return *this;
  }
  InlineVector& operator=(const std::vector<T>& v) {
    assign(v.begin(), v.end());
    return *this;
  }
  ~InlineVector() { Free(); }

  T* data() { return OnHeap() ? heap_ : inline_; }
  const T* data() const { return OnHeap() ? heap_ : inline_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    T* grown = static_cast<T*>(std::malloc(n * sizeof(T)));
    if (!grown) throw std::bad_alloc();
    const uint32_t size = size_;
    if (size > 0) std::memcpy(grown, data(), size * sizeof(T));
    Free();
    heap_ = grown;
    size_ = size;
    capacity_ = static_cast<uint32_t>(n);
  }
  void clear() { size_ = 0; }  // keeps the capacity, as std::vector does
  void push_back(const T& value) {
    if (size_ == capacity_) {
      const T copy = value;  // (value may live in this vector)
      reserve(2 * static_cast<size_t>(capacity_));
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = value;
  }
  void resize(size_t n, const T& value = T()) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = value;
    size_ = static_cast<uint32_t>(n);
  }
  void assign(size_t n, const T& value) {
    clear();
    resize(n, value);
  }
  template <typename It, typename = decltype(*std::declval<It>())>
  void assign(It first, It last) {
    clear();
    reserve(static_cast<size_t>(std::distance(first, last)));
    for (; first != last; ++first) data()[size_++] = *first;
  }
  T* erase(T* first, T* last) {
    std::memmove(first, last, static_cast<size_t>(end() - last) * sizeof(T));
    size_ -= static_cast<uint32_t>(last - first);
    return first;
  }
  T* erase(T* at) { return erase(at, at + 1); }

  std::vector<T> ToVector() const { return std::vector<T>(begin(), end()); }

  friend bool operator==(const InlineVector& a, const InlineVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const InlineVector& a, const InlineVector& b) { return !(a == b); }
  friend bool operator<(const InlineVector& a, const InlineVector& b) {
    return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool OnHeap() const { return capacity_ > N; }
  void Free() {
    if (OnHeap()) std::free(heap_);
    capacity_ = N;
    size_ = 0;
  }
  // Takes o's values (its heap block, or a copy of its inline ones) and
  // leaves it empty.
  void Steal(InlineVector& o) {
    size_ = o.size_;
    capacity_ = o.capacity_;
    if (o.OnHeap()) {
      heap_ = o.heap_;
    } else {
      std::memcpy(inline_, o.inline_, o.size_ * sizeof(T));
    }
    o.size_ = 0;
    o.capacity_ = N;
  }

  uint32_t size_ = 0, capacity_ = N;
  union {
    T inline_[N];
    T* heap_;
  };
};

}  // namespace loom
