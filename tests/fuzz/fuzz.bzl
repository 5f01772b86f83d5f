"""rdmaemu_fuzz_target: one fuzz target, built two ways (docs/testing.md).

Plain build (gcc): NAME is a cc_test whose main (replay_main.cc) feeds the
target's checked-in seed corpus to LLVMFuzzerTestOneInput once, so
`bazel test //...` replays every seed and every kept crash reproducer.

--config=fuzz (clang, ASan, UBSan): NAME links libFuzzer's main instead and
still replays the corpus as a test; NAME_run (tagged manual, in
//tests:fuzz) fuzzes for $RDMAEMU_FUZZ_SECONDS (30 by default) from the
seeds and fails on any crash, leak or timeout (run_fuzzer.sh).
"""

load("//tools/bazel:copts.bzl", "TEST_COPTS")

def rdmaemu_fuzz_target(name, srcs, deps, size = "small", env = {}):
    corpus = "//tests/fuzz/corpus:" + name
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        copts = TEST_COPTS,
        args = ["$(locations %s)" % corpus],
        data = [corpus],
        env = env,
        linkopts = select({
            "//tests/fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//tests/fuzz:libfuzzer": [],
            "//conditions:default": ["//tests/fuzz:replay_main"],
        }),
    )
    native.sh_test(
        name = name + "_run",
        size = "medium",
        srcs = ["//tests/fuzz:run_fuzzer.sh"],
        args = ["$(location :%s)" % name, "$(locations %s)" % corpus],
        data = [":" + name, corpus],
        env = env,
        # Only meaningful in --config=fuzz: tools/test runs //tests:fuzz there.
        tags = ["manual", "fuzz"],
    )
