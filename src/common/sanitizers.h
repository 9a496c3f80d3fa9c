// sanitizers.h: whether this build runs under a sanitizer, as constants the code and the tests
// branch on (gcc defines __SANITIZE_ADDRESS__ and __SANITIZE_THREAD__; clang has __has_feature).
#pragma once

namespace memforensics {

#if defined(__has_feature)
#define MEMF_HAS_FEATURE(x) __has_feature(x)
#else
#define MEMF_HAS_FEATURE(x) 0
#endif

// AddressSanitizer: its shadow memory needs terabytes of address space (RLIMIT_AS limits do not
// apply) and its runtime handles SIGBUS and SIGSEGV itself.
#if defined(__SANITIZE_ADDRESS__) || MEMF_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Any sanitizer whose runtime replaces glibc's malloc and maps shadow memory (address, memory or
// thread): mallopt and the arenas' huge-page mode do not apply, nor do address-space limits.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) ||             \
    MEMF_HAS_FEATURE(address_sanitizer) || MEMF_HAS_FEATURE(memory_sanitizer) || \
    MEMF_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kSanitizerRuntime = true;
#else
inline constexpr bool kSanitizerRuntime = false;
#endif

#undef MEMF_HAS_FEATURE

}  // namespace memforensics
