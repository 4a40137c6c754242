"""One CUDA kernel family: nvcc-compiled device code plus its registrations.

Bazel 4 has no CUDA rules: a genrule runs nvcc on the family's .cu to a
position-independent object, which cc_library takes as a source. SASS for
sm_80 (A100) and sm_90 (H100/H200), plus compute_90 PTX for newer GPUs to
JIT; --config=cuda_compile_check (CI, where no GPU runs the code) generates
sm_90 alone (norm_kernels.cu: 11.7 s -> 6.9 s). Every target is
incompatible without --config=cuda.
"""

CUDA_ONLY = select({
    "//:cuda_enabled": [],
    "//conditions:default": ["//core/cuda:requires_config_cuda"],
})

NVCC_FLAGS = " ".join([
    "-c",
    "-Xcompiler -fPIC",
    "-Xcompiler -Wall",
    "-Xcompiler -Wextra",
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-I.",
    "-I/usr/local/cuda/include",
])

CODE_GENERATIONS = select({
    "//:cuda_sm90_only": "-gencode arch=compute_90,code=sm_90",
    "//conditions:default": " ".join([
        "-gencode arch=compute_80,code=sm_80",
        "-gencode arch=compute_90,code=sm_90",
        "-gencode arch=compute_90,code=compute_90",
    ]),
})

def cuda_object(name, src, hdrs = [], nvcc_flags = []):
    """nvcc -c src -> name.o; hdrs are the headers src includes."""
    native.genrule(
        name = name,
        srcs = [src] + hdrs,
        outs = [name + ".o"],
        cmd = "/usr/local/cuda/bin/nvcc " + " ".join([NVCC_FLAGS] + nvcc_flags) + " " + CODE_GENERATIONS +
              " $(location " + src + ") -o $@",
        target_compatible_with = CUDA_ONLY,
    )

def cuda_kernel_family(name, cu = True, extra_hdrs = [], deps = [], linkopts = [], nvcc_flags = []):
    """Library `name`_kernels: `name`_kernels.cc (registrations, gcc) and,
    with cu, `name`_kernels.cu + `name`_kernels.h (device code, launchers)."""
    srcs = [name + "_kernels.cc"]
    hdrs = []
    if cu:
        cuda_object(
            name = name + "_kernels_o",
            src = name + "_kernels.cu",
            hdrs = [name + "_kernels.h", "device_util.cuh", "//core:counter_rng.h", "//core:host_device.h"] + extra_hdrs,
            nvcc_flags = nvcc_flags,
        )
        srcs.append(":" + name + "_kernels_o")
        hdrs.append(name + "_kernels.h")
    native.cc_library(
        name = name + "_kernels",
        srcs = srcs,
        hdrs = hdrs,
        linkopts = linkopts,
        target_compatible_with = CUDA_ONLY,
        deps = [":cuda_kernel_util"] + deps,
        alwayslink = True,
    )
