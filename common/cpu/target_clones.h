#ifndef TRIDENT_COMMON_CPU_TARGET_CLONES_H_
#define TRIDENT_COMMON_CPU_TARGET_CLONES_H_

// TRIDENT_TARGET_CLONES before a hot loop's function builds it for AVX-512
// (x86-64-v4), AVX2 (v3) and the baseline, picked at load time by an ifunc.
// Under ThreadSanitizer the baseline alone: the ifunc resolver runs during
// relocation, before TSan's runtime is up, and its instrumented code
// crashes the program before main.

#if defined(__SANITIZE_THREAD__)
#define TRIDENT_TARGET_CLONES
#else
#define TRIDENT_TARGET_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

#endif  // TRIDENT_COMMON_CPU_TARGET_CLONES_H_
