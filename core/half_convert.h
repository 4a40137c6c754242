// Bulk conversions between f16 and f32 on the host, with the results of
// core/half.h's scalar conversions bit for bit (rounding to nearest even,
// subnormals kept, NaN canonical when narrowing and its payload kept when
// widening). Where the compiler targets F16C (-march=native on every x86
// machine loom runs on) they convert 8 elements per instruction, with
// the NaN lanes patched to the scalar results; elsewhere they loop over the
// scalar functions. The mixed-precision CPU kernels spend their time here:
// the scalar f16 conversions took half of an fp16 MLP step.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace loom {

void WidenF16(const Float16* in, float* out, int64_t n);
void NarrowToF16(const float* in, Float16* out, int64_t n);

}  // namespace loom
