// Internals of the MPI backend that tests need to reach.
#ifndef MEGACKPT_DIST_MPI_INTERNAL_H_
#define MEGACKPT_DIST_MPI_INTERNAL_H_

#include <cstddef>
#include <cstdint>

namespace megackpt::dist {

// Every point-to-point message starts with this header (little endian):
//   0  u32 magic "MGPG" (0x4750474d)   4  u8 version (1)   5  u8 collective kind
//   6  u8 phase                        7  u8 reserved (0)  8  i32 root
//   12 i32 sender rank                16  u64 collective sequence number
//   24 u64 payload length; the payload follows as ceil(length / fragment) messages
//   with the same tag, each at most the fragment size: MPI counts are ints, and a
//   completed fragment tells the poller that data is flowing (see Backoff).
inline constexpr uint32_t kMpiHeaderMagic = 0x4750474d;
inline constexpr uint8_t kMpiHeaderVersion = 1;
inline constexpr size_t kMpiHeaderBytes = 32;
inline constexpr size_t kMpiDefaultFragmentBytes = size_t{1} << 20;
// Largest blob one message may carry; larger is ResourceExhausted.
inline constexpr uint64_t kMpiMaxBlobBytes = uint64_t{1} << 36;

// Splits payloads into fragments of at most `bytes` (default 1 MiB) so that tests
// exercise the multi-fragment path with small blobs. Applies to messages sent and
// received afterwards; every rank must use the same value.
void SetMpiFragmentBytesForTesting(size_t bytes);

// The thread support level MPI provided (MPI_THREAD_*), or -1 before initialization.
int MpiThreadLevel();

// True when megackpt called MPI_Init_thread (and will call MPI_Finalize at exit).
bool MpiInitializedByMegackpt();

}  // namespace megackpt::dist

#endif  // MEGACKPT_DIST_MPI_INTERNAL_H_
