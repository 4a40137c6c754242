"""One fuzz target, two ways: a libFuzzer binary under --config=fuzz
(tests/fuzz/run.sh builds it with clang), and everywhere a test that runs
the target over its committed corpus (seeds and past crashes)."""

def loom_fuzz_target(name, srcs, deps):
    native.cc_binary(
        name = name,
        srcs = srcs + ["fuzz_input.h"],
        deps = deps,
        linkopts = select({
            ":fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["manual"],  # links only with clang's libFuzzer
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs + ["fuzz_input.h", "corpus_main.cc"],
        deps = deps,
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/*"]),
    )
