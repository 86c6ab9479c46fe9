// The tpu device's random number generator: a counter-based Philox generator whose state is a
// seed and an offset (as PyTorch's CUDA generator). Every random kernel reserves a range of
// counters from it and asks the runtime for those numbers, so the same seed gives the same
// numbers in every eager mode and for any thread count.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/GeneratorImpl.h>

#include <cstdint>
#include <utility>

namespace dft {

class TpuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit TpuGeneratorImpl(uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  // The state is 16 bytes (a CPU uint8 tensor): the seed, then the offset, little-endian.
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

  // Reserves `counters` Philox counters: returns the seed and the first counter, and moves the
  // offset past them. Callers hold the generator's mutex.
  std::pair<uint64_t, uint64_t> reserve(uint64_t counters);

 private:
  TpuGeneratorImpl* clone_impl() const override;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The device's default generator (what torch.manual_seed seeds).
const at::Generator& default_generator();
// A fresh generator (torch.Generator(device="tpu")).
at::Generator new_generator(uint64_t seed);

}  // namespace dft
