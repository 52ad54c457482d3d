"""cc_headers: the header files of cc_library targets, as plain files.

trident_cuda_library compiles .cu files in a genrule, which sees only the
files listed as its sources; this rule (made by trident_cuda_library for its
device_deps) lets it read headers of libraries in other packages (through
their public targets) without copying them."""

def _cc_headers_impl(ctx):
    headers = [dep[CcInfo].compilation_context.headers for dep in ctx.attr.deps]
    return [DefaultInfo(files = depset(transitive = headers))]

cc_headers = rule(
    implementation = _cc_headers_impl,
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
