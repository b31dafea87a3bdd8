// Test hook of core/checksum.cc: which BlockCrc32s kernels may run. On a CPU
// with AVX-512 the 128-bit PCLMULQDQ kernels only see blocks that are not a
// multiple of 64 bytes; a test limits the dispatch to check every kernel on
// every block size the machine can run. Not for production code.
#ifndef MEGACKPT_SRC_CORE_CHECKSUM_KERNELS_H_
#define MEGACKPT_SRC_CORE_CHECKSUM_KERNELS_H_

namespace megackpt::inline core::checksum_internal {

// Ordered from the most to the least capable: a limit allows itself and every
// kernel below it.
enum class CrcKernels {
  kBest,       // the fastest the CPU has (the default)
  kVclmul256,  // no 512-bit VPCLMULQDQ: 256-bit VPCLMULQDQ (AVX2), then as kClmul128
  kClmul128,   // no VPCLMULQDQ: 128-bit PCLMULQDQ, then one Crc32 per block
  kPortable,   // one Crc32 call per block
};

// Sets the kernels BlockCrc32s may use, process-wide, until the next call.
void LimitCrcKernelsForTest(CrcKernels kernels);

}  // namespace megackpt::inline core::checksum_internal

#endif  // MEGACKPT_SRC_CORE_CHECKSUM_KERNELS_H_
