"""Compiler flags shared by every rdmaemu target (Abseil's pattern)."""

# Warnings are errors for our own code only; system headers stay quiet.
COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wswitch",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
]

TEST_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    "-Wno-missing-field-initializers",
    "-Wno-sign-compare",
]
