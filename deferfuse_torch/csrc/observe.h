// Why a sync point or a CPU fallback happened: while explain() or trace() is on (and with
// DEFERFUSE_LOG set), the device notes the user's source line (the first Python frame outside
// torch and deferfuse_torch) for each one. Off, a note costs one relaxed atomic load.
#pragma once

#include <cstdint>

namespace dft {

// A host read, synchronize or item() is about to wait for the device; `what` names it.
void note_sync(const char* what);

// The op `name` is about to run on the CPU fallback.
void note_fallback(const char* name);

// An op is about to be recorded: while explain() or trace() runs, or DEFERFUSE_LOG prints
// fusion cuts, the runtime's tag on this thread names the user's source line, so a fusion cut
// at this op names it in the timeline and in the log. Off, one relaxed atomic load and one bool.
void note_op();

// torch.profiler's correlation id of the op this thread is in (0: none). The runtime's tag
// on the thread is (note_op's source line id << 32) | this id: a run carries its op's
// correlation id and a recorded op its source line, each in its own half.
void set_correlation_tag(uint32_t id);

}  // namespace dft
