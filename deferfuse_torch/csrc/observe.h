// Why a sync point or a CPU fallback happened: while explain() or trace() is on (and with
// DEFERFUSE_LOG set), the device notes the user's source line (the first Python frame outside
// torch and deferfuse_torch) for each one. Off, a note costs one relaxed atomic load.
#pragma once

namespace dft {

// A host read, synchronize or item() is about to wait for the device; `what` names it.
void note_sync(const char* what);

// The op `name` is about to run on the CPU fallback.
void note_fallback(const char* name);

}  // namespace dft
