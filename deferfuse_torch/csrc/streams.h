// torch's tpu streams on the runtime's streams. Stream id 0 is the runtime's default stream;
// ids 1..kStreamPoolSize name a pool of runtime streams created on first use (each owns a
// worker thread, so, as CUDA's stream pool, their number is bounded and torch.Stream() hands
// them out round robin). The current stream is per thread, as in PyTorch.
#pragma once

#include <c10/core/Stream.h>

#include <cstdint>

namespace dft {

// The runtime stream the calling thread records ops on (its current tpu stream).
uint64_t current_stream();

// The runtime handle of a torch tpu stream (creating the pool slot's stream on first use).
uint64_t stream_handle(const c10::Stream& s);

// The calling thread's current tpu stream, and swapping it (returns the previous one).
c10::Stream current_torch_stream();
c10::Stream exchange_stream(const c10::Stream& s);

// The next stream of the pool (torch.Stream(device="tpu"), getStreamFromGlobalPool).
c10::Stream stream_from_pool();

}  // namespace dft
