"""The native C++ rules under rules_cc's names, for Bazel 4 offline."""

cc_library = native.cc_library
cc_binary = native.cc_binary
cc_test = native.cc_test
cc_import = native.cc_import
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
cc_proto_library = native.cc_proto_library
objc_library = native.objc_library
fdo_profile = native.fdo_profile
fdo_prefetch_hints = native.fdo_prefetch_hints
