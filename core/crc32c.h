// CRC32C (Castagnoli, polynomial 0x1EDC6F41 reflected as 0x82F63B78), the
// checksum of checkpoint files. Uses the SSE4.2 crc32 instruction when the
// build targets it, a slice-by-8 table otherwise; both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

// The CRC32C of (the bytes that gave `crc`) followed by `data[0, n)`.
// Start from 0: Crc32cExtend(Crc32cExtend(0, a, na), b, nb) == CRC of a ++ b.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

namespace internal {
// The table version, always compiled, so tests can check it against the
// hardware path on machines that have one.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);
}  // namespace internal

}  // namespace loom
