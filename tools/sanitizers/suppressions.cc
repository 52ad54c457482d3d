// What the sanitizers are told to leave out, linked into every test under
// --config=asan, --config=ubsan or --config=tsan (tools/build/defs.bzl).
// Each entry is a report about code that is not Trident's, with the reason.
// Nothing of Trident's own belongs here: fix it instead.

extern "C" {

// LeakSanitizer.
const char* __lsan_default_suppressions() {
  return
      // c-ares (gRPC's DNS resolver, resolving "localhost" in TLS tests)
      // keeps its per-channel resolver state until process exit; Debian's
      // libcares.so.2, reported at exit only.
      "leak:libcares.so\n"
      // OpenSSL objects (certificates, keys) held by gRPC's TLS credentials
      // and handshakers, which gRPC's background threads may still own at
      // exit; reported at exit only, allocated inside libcrypto (sometimes,
      // as the threads' timing goes, in tls_test).
      "leak:libcrypto.so\n";
}

// ThreadSanitizer: hand-offs through libraries built without it (gRPC's
// completion queues, UCX's progress thread, OpenMP's runtime) look like
// races because TSan cannot see their synchronization.
const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libgrpc++.so\n"
         "called_from_lib:libucp.so\n"
         "called_from_lib:libuct.so\n"
         "called_from_lib:libucs.so\n"
         "called_from_lib:libgomp.so\n"
         // Abseil's deadlock detector (on in Debian's build) keeps its lock
         // graph under an internal spinlock TSan cannot see; its memmoves
         // reach TSan's interceptor.
         "called_from_lib:libabsl_graphcycles_internal.so\n"
         "called_from_lib:libabsl_synchronization.so\n"
         // gRPC's C++ templates, instantiated in our code, hand each call's
         // state between gRPC's threads through its core's completion
         // queues and locks (libgrpc, uninstrumented).
         "race:grpc::internal::\n"
         "race:grpc::Server\n"
         "race:libgrpc.so\n"
         "race:libgrpc++.so\n";
}

}  // extern "C"
