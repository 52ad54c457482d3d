"""Build macros for Trident. Every BUILD file uses these instead of the native
rules, so that warnings, sanitizers, CUDA handling and GPU tags stay uniform."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_PATH")
load("//tools/build:cc_headers.bzl", "cc_headers")

# Warnings are errors in project code. Generated code (protoc) and system
# headers (under /usr/include, which the compiler treats as system headers)
# are exempt.
TRIDENT_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
    # Designated initializers that leave defaulted members out are intended.
    "-Wno-missing-field-initializers",
]

# CUDA architectures compiled into every CUDA target. sm_90 (Hopper) is the
# floor; add more here as wanted.
CUDA_ARCHS = ["90"]

def _with_copts(kwargs):
    kwargs["copts"] = TRIDENT_COPTS + kwargs.get("copts", [])
    return kwargs

def trident_cc_library(name, gpu = False, **kwargs):
    """A library. `gpu = True` makes it incompatible where CUDA is absent or
    disabled (host code that links a CUDA toolkit library)."""
    if gpu:
        kwargs["target_compatible_with"] = _cuda_compatible()
    native.cc_library(name = name, **_with_copts(kwargs))

def trident_cc_binary(name, **kwargs):
    native.cc_binary(name = name, **_with_copts(kwargs))

def trident_cc_test(name, gpu = False, tags = [], size = "small", **kwargs):
    """A test. `gpu = True` tags it `gpu` and `exclusive` (CI runs -gpu) and
    makes it incompatible where CUDA is absent or disabled."""
    if gpu:
        tags = tags + ["gpu", "exclusive"]
        kwargs["target_compatible_with"] = _cuda_compatible()
    kwargs["deps"] = kwargs.get("deps", []) + select({
        "//tools/build:sanitized": ["//tools/sanitizers:suppressions"],
        "//conditions:default": [],
    }) + select({
        "//tools/build:tsan": [
            "//tools/sanitizers:absl_tsan_annotations",
            "//tools/sanitizers:gomp_tsan_annotations",
        ],
        "//conditions:default": [],
    })
    native.cc_test(name = name, tags = tags, size = size, **_with_copts(kwargs))

def trident_cc_benchmark(name, deps = [], tags = [], gpu = False, benchmark_main = True, **kwargs):
    """A Google Benchmark binary: testonly, tagged `benchmark`, never run as a test.

    `benchmark_main = False` is for benchmark drivers with their own main().
    """
    if gpu:
        tags = tags + ["gpu"]
        kwargs["target_compatible_with"] = _cuda_compatible()
    native.cc_binary(
        name = name,
        testonly = True,
        tags = tags + ["benchmark"],
        deps = deps + (["//third_party:benchmark_main"] if benchmark_main else []),
        **_with_copts(kwargs)
    )

def _cuda_compatible():
    if not CUDA_FOUND:
        return ["//tools/build:incompatible"]
    return select({
        "//tools/build:cuda_disabled": ["//tools/build:incompatible"],
        "//conditions:default": [],
    })

def trident_cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], cuda_hdrs = [], device_deps = [], archs = None, **kwargs):
    """Compiles `.cu` sources with nvcc and wraps the objects in a cc_library.

    `.cc` files in `srcs` are host code compiled by the C++ compiler (argument
    checks, absl::Status wrappers); `.cu` files go through nvcc. `hdrs` are
    host headers (usable from plain C++); `cuda_hdrs` are private headers the
    `.cu` and `.cc` sources share (launcher declarations). `device_deps` are
    header-only libraries the `.cu` sources include (common/numeric's
    counter_stream, kernels/cuda/pdl): nvcc sees only the files its rule
    lists, so their headers are listed through cc_headers; they are deps of
    the library as well. `archs` replaces
    CUDA_ARCHS for this target (e.g. ["90a"] for Hopper-only instructions such
    as wgmma). Where nvcc is absent, or the build runs with `--config=cpu`,
    the target is incompatible and skipped.
    """
    compatible = _cuda_compatible()
    if device_deps:
        cc_headers(
            name = name + "_device_headers",
            deps = device_deps,
            testonly = kwargs.get("testonly", False),
        )
        cuda_hdrs = cuda_hdrs + [":" + name + "_device_headers"]
        deps = deps + device_deps
    objs = []
    cc_srcs = [s for s in srcs if not s.endswith(".cu")]
    srcs = [s for s in srcs if s.endswith(".cu")]
    if CUDA_FOUND:
        gencode = " ".join([
            "-gencode arch=compute_%s,code=sm_%s" % (a, a)
            for a in (archs if archs else CUDA_ARCHS)
        ])
        for src in srcs:
            obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
            native.genrule(
                name = obj + "_compile",
                srcs = [src] + hdrs + cuda_hdrs,
                outs = [obj],
                cmd = " ".join([
                    CUDA_PATH + "/bin/nvcc",
                    "-c -std=c++20 -O3 -Xcompiler -fPIC",
                    "-Xcompiler -Wall -Werror all-warnings",
                    gencode,
                    "-I. -I$(GENDIR)",
                    " ".join(copts),
                    "-o $@ $(location %s)" % src,
                ]),
                target_compatible_with = compatible,
                tags = kwargs.get("tags", []),
                testonly = kwargs.get("testonly", False),
            )
            objs.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = objs + ((cc_srcs + cuda_hdrs) if CUDA_FOUND else []),
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda"],
        target_compatible_with = compatible,
        copts = TRIDENT_COPTS,
        **kwargs
    )

def trident_proto_library(name, srcs, deps = [], proto_root = "proto", grpc = True, visibility = None, testonly = False):
    """Generates C++ (and gRPC stubs) for `srcs` with Debian's protoc.

    `proto_root` is the directory, relative to the repository root, that import
    paths are relative to. Generated headers are included by their import
    path, e.g. "trident/v1/generation.pb.h". `deps` are other
    trident_proto_library targets whose .proto files these import.
    """
    repo = native.repository_name()
    repo_root = "" if repo == "@" else "external/" + repo[1:]
    include_dir = "/".join([p for p in [repo_root, proto_root] if p])
    pkg = native.package_name()
    rel_pkg = pkg[len(proto_root):].lstrip("/") if proto_root else pkg

    outs = []
    for src in srcs:
        stem = src[:-len(".proto")]
        outs += [stem + ".pb.h", stem + ".pb.cc"]
        if grpc:
            outs += [stem + ".grpc.pb.h", stem + ".grpc.pb.cc"]

    native.filegroup(
        name = name + "_files",
        srcs = srcs + [d + "_files" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    out_dir = "$(GENDIR)/" + include_dir if include_dir else "$(GENDIR)"
    files = " ".join(["/".join([p for p in [include_dir, rel_pkg, s] if p]) for s in srcs])
    cmd = "protoc -I%s -I/usr/include --cpp_out=%s " % (include_dir or ".", out_dir)
    if grpc:
        cmd += "--grpc_out=%s --plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) " % out_dir
    native.genrule(
        name = name + "_gen",
        srcs = [":" + name + "_files"],
        outs = outs,
        cmd = cmd + files,
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        strip_include_prefix = ("/" + proto_root) if proto_root and repo == "@" else None,
        deps = deps + ["@trident//third_party:grpc" if grpc else "@trident//third_party:protobuf"],
        visibility = visibility,
        testonly = testonly,
    )

def trident_cc_fuzzer(name, srcs, deps = [], corpus = [], **kwargs):
    """A libFuzzer target (defines LLVMFuzzerTestOneInput) plus a replay test.

    `bazel build --config=fuzz //x:name` (see tools/fuzz.sh, which uses clang
    and its own output base) links it with libFuzzer and ASan/UBSan; in every
    other build it links a replay main that runs the inputs named on its
    command line. `name_replay_test` runs the checked-in `corpus` files
    through it in every test run, so crashes found once stay fixed.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        testonly = True,
        tags = ["fuzzer"],
        linkopts = select({
            "//tools/build:fuzzing": ["-fsanitize=fuzzer,address,undefined"],
            "//conditions:default": [],
        }),
        deps = deps + select({
            "//tools/build:fuzzing": [],
            "//conditions:default": ["//common/testing:fuzz_replay_main"],
        }),
        **_with_copts(kwargs)
    )
    native.cc_test(
        name = name + "_replay_test",
        srcs = srcs,
        size = "small",
        args = ["$(location %s)" % c for c in corpus],
        data = corpus,
        deps = deps + ["//common/testing:fuzz_replay_main"],
        target_compatible_with = select({
            "//tools/build:fuzzing": ["//tools/build:incompatible"],
            "//conditions:default": [],
        }),
        **_with_copts(dict(kwargs))
    )

def if_cuda(if_true, if_false = []):
    """`if_true` in builds with CUDA (nvcc found and not --config=cpu), else
    `if_false`: for deps on CUDA libraries from code that also builds without
    them, together with cuda_local_defines()."""
    if not CUDA_FOUND:
        return if_false
    return select({
        "//tools/build:cuda_disabled": if_false,
        "//conditions:default": if_true,
    })

def cuda_local_defines():
    """TRIDENT_HAVE_CUDA=1 where if_cuda() deps are present."""
    return if_cuda(["TRIDENT_HAVE_CUDA=1"])
