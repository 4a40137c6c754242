// Whole-file reads and header size checks shared by the dataset readers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace loom {

// The file's bytes, gunzipped when it starts with the gzip magic number
// (plain files pass through unchanged, so "x" and "x.gz" read alike).
// Concatenated gzip members read as one stream; anything else after the
// last member is an error. Errors name the file: missing, unreadable,
// corrupt or truncated gzip stream, trailing garbage.
StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path);

// The product of `dims` (each >= 0) in *product; false when the product of
// the non-zero ones exceeds int64, so that every sub-product (one image's
// size) fits too.
bool CheckedProduct(const std::vector<int64_t>& dims, int64_t* product);

// CheckedProduct of dimensions read from `path`'s header, as a DataLoss
// error naming the file and the dimensions when it fails: a wrapped size
// would pass the data-size check and be read out of bounds.
StatusOr<int64_t> HeaderBytes(const std::string& path, const std::vector<int64_t>& dims);

}  // namespace loom
