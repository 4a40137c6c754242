// LOOM_HOST_DEVICE marks functions that CUDA device code calls too (the
// counter-based generator, the half-precision conversions); plain inline
// functions to every other compiler.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
