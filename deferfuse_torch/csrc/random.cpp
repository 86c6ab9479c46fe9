// Random numbers on the device: the Philox generator (random.h) and the ATen random kernels
// built on the runtime's RANDOM op (uniform or standard normal numbers for a seed and a counter
// offset). Each kernel reserves its counters from the generator, so a seed reproduces the same
// numbers in strict, debug and defer, and draws never overlap.
#include "random.h"

#include "common.h"

#include <ATen/core/DistributionsHelper.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/irange.h>
#include <ATen/native/DistributionTemplates.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

namespace dft {

TpuGeneratorImpl::TpuGeneratorImpl(uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, 0),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      seed_(seed) {}

void TpuGeneratorImpl::set_current_seed(uint64_t seed) {
  seed_ = seed;
  offset_ = 0;
}

void TpuGeneratorImpl::set_offset(uint64_t offset) { offset_ = offset; }
uint64_t TpuGeneratorImpl::get_offset() const { return offset_; }
uint64_t TpuGeneratorImpl::current_seed() const { return seed_; }

uint64_t TpuGeneratorImpl::seed() {
  uint64_t s = c10::detail::getNonDeterministicRandom();
  set_current_seed(s);
  return s;
}

void TpuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  TORCH_CHECK(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() &&
                  new_state.numel() == 16 && new_state.device().is_cpu(),
              "tpu: a generator state is a CPU uint8 tensor of 16 bytes (seed, offset), got ",
              new_state.numel(), " elements of ", new_state.dtype().name());
  const auto* p = static_cast<const uint8_t*>(new_state.data());
  std::memcpy(&seed_, p, 8);
  std::memcpy(&offset_, p + 8, 8);
}

c10::intrusive_ptr<c10::TensorImpl> TpuGeneratorImpl::get_state() const {
  auto t = at::empty({16}, at::TensorOptions().dtype(at::kByte).device(at::kCPU));
  auto* p = t.data_ptr<uint8_t>();
  std::memcpy(p, &seed_, 8);
  std::memcpy(p + 8, &offset_, 8);
  return t.getIntrusivePtr();
}

std::pair<uint64_t, uint64_t> TpuGeneratorImpl::reserve(uint64_t counters) {
  uint64_t start = offset_;
  offset_ += counters;
  return {seed_, start};
}

TpuGeneratorImpl* TpuGeneratorImpl::clone_impl() const {
  auto* g = new TpuGeneratorImpl(seed_);
  g->offset_ = offset_;
  return g;
}

const at::Generator& default_generator() {
  static at::Generator g = at::make_generator<TpuGeneratorImpl>(c10::default_rng_seed_val);
  return g;
}

at::Generator new_generator(uint64_t seed) { return at::make_generator<TpuGeneratorImpl>(seed); }

namespace {

enum class Dist { Uniform, Normal };

// `sizes` numbers of `dtype` (a floating dtype): uniform in [0, 1) or standard normal.
at::Tensor draw(at::IntArrayRef sizes, at::ScalarType dtype, Dist dist,
                const std::optional<at::Generator>& gen_opt) {
  TORCH_CHECK(at::isFloatingType(dtype), "tpu: random draws are floating, got ", dtype);
  auto* gen = at::get_generator_or_default<TpuGeneratorImpl>(gen_opt, default_generator());
  uint64_t numel = static_cast<uint64_t>(c10::multiply_integers(sizes));
  std::pair<uint64_t, uint64_t> key;
  {
    std::lock_guard<std::mutex> lock(gen->mutex_);
    key = gen->reserve(numel);
  }
  DfuseAttrs a{};
  a.sub_op = dist == Dist::Uniform ? DFUSE_RANDOM_DIST_UNIFORM : DFUSE_RANDOM_DIST_NORMAL;
  a.dtype = to_dtype(dtype);
  TORCH_CHECK(sizes.size() <= DFUSE_MAX_REDUCE_DIMS, "tpu: random tensors of rank ", sizes.size(),
              " are not supported (at most ", DFUSE_MAX_REDUCE_DIMS, ")");
  for (size_t i = 0; i < sizes.size(); ++i) a.dims[i] = sizes[i];
  a.n_dims = sizes.size();
  return run(DFUSE_OP_KIND_RANDOM, &a,
             Operands().s(at::Scalar(int64_t(key.first))).s(at::Scalar(int64_t(key.second))),
             "random draw");
}

// The floating dtype uniform_ draws in before its values become `t`'s dtype.
at::ScalarType draw_dtype(const at::Tensor& t) {
  return at::isFloatingType(t.scalar_type()) ? t.scalar_type() : at::kDouble;
}

// The dtype a random value is drawn and transformed in when it is not itself the result:
// float16 and bfloat16 in float32, rounded once at the end, as CPU's kernels compute them.
// Drawn in bfloat16, a uniform number takes one of 256 values: exponential_ gave exact zeros
// (0.4% of them, so gumbel_softmax's hard rows went NaN) and dropout's keep probability moved
// by up to 1/256.
at::ScalarType transform_dtype(const at::Tensor& t) {
  auto dt = draw_dtype(t);
  return dt == at::kHalf || dt == at::kBFloat16 ? at::kFloat : dt;
}

void assign(at::Tensor& self, const at::Tensor& value) {
  run_into(DFUSE_OP_KIND_COPY, nullptr, Operands().t(cast(value, self.scalar_type())), self,
           "random fill");
}

at::Tensor& uniform_(at::Tensor& self, double from, double to,
                     std::optional<at::Generator> gen) {
  // CPU's checks of the dtype and bounds (an integer or bool tensor, a bound past the dtype's
  // range, a range wider than it holds), made on an empty CPU tensor: they come before its
  // kernel, so no number is drawn from CPU's generator. Unchecked, `uniform_(0, inf)` filled
  // infinities and `torch.rand(n, dtype=torch.long)` zeros.
  at::empty({0}, self.options().device(at::kCPU)).uniform_(from, to);
  // (CPU's complex uniform_ skips its checks on an empty tensor: the range is checked here too.)
  TORCH_CHECK(from <= to, "uniform_ expects to return a [from, to) range, but found from=", from,
              " > to=", to);
  if (self.numel() == 0) return self;
  auto u = draw(self.sizes(), draw_dtype(self), Dist::Uniform, gen);
  assign(self, from == 0.0 && to == 1.0 ? u : u * (to - from) + from);
  return self;
}

at::Tensor& normal_(at::Tensor& self, double mean, double std,
                    std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  // CPU's kernels draw floating dtypes only (`torch.randn(n, dtype=torch.long)` raises there).
  if (self.numel() > 0) check_float_kernel(self.scalar_type(), "normal_kernel_cpu");
  if (self.numel() == 0) return self;
  auto z = draw(self.sizes(), transform_dtype(self), Dist::Normal, gen);
  assign(self, mean == 0.0 && std == 1.0 ? z : z * std + mean);
  return self;
}

// normal(mean, std) with a tensor mean and/or std: mean + std * z, z standard normal over the
// broadcast shape. A float std is checked; a tensor std's elements are not (CPU raises for a
// negative one; checking would read them back every call): stated in the README, as
// multinomial's probabilities.
at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std,
                                std::optional<at::Generator> gen) {
  auto dt = at::result_type(mean, std);
  TORCH_CHECK(at::isFloatingType(dt), "normal expects floating mean and std, got ", dt);
  auto z = draw(at::infer_size(mean.sizes(), std.sizes()), dt, Dist::Normal, gen);
  return mean + std * z;
}

at::Tensor normal_tensor_float(const at::Tensor& mean, double std,
                               std::optional<at::Generator> gen) {
  TORCH_CHECK(std >= 0.0, "normal expects std >= 0.0, but found std ", std);
  TORCH_CHECK(at::isFloatingType(mean.scalar_type()), "normal expects a floating mean, got ",
              mean.scalar_type());
  return draw(mean.sizes(), mean.scalar_type(), Dist::Normal, gen) * std + mean;
}

at::Tensor normal_float_tensor(double mean, const at::Tensor& std,
                               std::optional<at::Generator> gen) {
  TORCH_CHECK(at::isFloatingType(std.scalar_type()), "normal expects a floating std, got ",
              std.scalar_type());
  return std * draw(std.sizes(), std.scalar_type(), Dist::Normal, gen) + mean;
}

// Integers drawn uniformly from [from, from + range), added to `from` in int64 (in float64 a
// `from` past 2^53 lost its low bits): up to 2^53 as floor(u * range), u in f64 (53 random
// bits); past it, as CPU draws them, random bits (two draws of 31 or 32) modulo the range.
at::Tensor& random_range(at::Tensor& self, int64_t from, uint64_t range,
                         std::optional<at::Generator> gen) {
  TORCH_CHECK(range > 0, "random_ expects 'from' to be less than 'to', but got an empty range");
  if (self.numel() == 0) return self;
  constexpr uint64_t kExact = uint64_t(1) << 53;
  at::Tensor v;
  if (range <= kExact) {
    auto u = draw(self.sizes(), at::kDouble, Dist::Uniform, gen);
    v = at::floor(u * double(range)).to(at::kLong);
  } else {
    auto bits = [&](double scale) {
      return at::floor(draw(self.sizes(), at::kDouble, Dist::Uniform, gen) * scale).to(at::kLong);
    };
    constexpr uint64_t kHalf = uint64_t(1) << 63;
    if (range <= kHalf) {
      auto r = bits(2147483648.0) * int64_t(4294967296) + bits(4294967296.0);  // [0, 2^63)
      v = range < kHalf ? r.remainder(int64_t(range)) : r;
    } else {
      // 64 bits (the product wraps): from + u wraps too, and a u past the range (the value
      // then at or past `to`, or wrapped below `from`) is taken modulo it by one subtraction.
      auto u = bits(4294967296.0) * int64_t(4294967296) + bits(4294967296.0);
      auto value = u + from;
      int64_t to = int64_t(uint64_t(from) + range);
      auto past = value.ge(to).logical_or(value.lt(from));
      assign(self, at::where(past, value - int64_t(range), value));  // range - 2^64: wraps
      return self;
    }
  }
  assign(self, from == 0 ? v : v + from);
  return self;
}

at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to,
                        std::optional<at::Generator> gen) {
  int64_t hi = to ? *to : [&] {
    // No upper bound: up to the dtype's largest value (floats: the largest exact integer).
    switch (self.scalar_type()) {
      case at::kFloat: return (int64_t(1) << 24) + 1;
      case at::kDouble: return (int64_t(1) << 53) + 1;
      case at::kHalf: return (int64_t(1) << 11) + 1;
      case at::kBFloat16: return (int64_t(1) << 8) + 1;
      case at::kBool: return int64_t(2);
      case at::kByte: return int64_t(256);
      case at::kInt: return int64_t(std::numeric_limits<int32_t>::max()) + 1;
      default: return std::numeric_limits<int64_t>::max();
    }
  }();
  TORCH_CHECK(from < hi, "random_ expects 'from' to be less than 'to', but got from=", from,
              " >= to=", hi);
  // CPU's check that both ends fit the dtype (int32 random_(0, 2**40) wrapped to negatives).
  if (to) at::native::templates::check_from_to_in_range(from, hi - 1, self.dtype());
  // In unsigned arithmetic: a span of 2^63 or more overflows int64 (undefined, and the
  // compiler then took it for less than 2^63).
  return random_range(self, from, uint64_t(hi) - uint64_t(from), gen);
}

at::Tensor& random_to(at::Tensor& self, int64_t to, std::optional<at::Generator> gen) {
  return random_from(self, 0, to, gen);
}

at::Tensor& random_(at::Tensor& self, std::optional<at::Generator> gen) {
  return random_from(self, 0, std::nullopt, gen);
}

// CPU's refusal of `self`'s dtype for a sampler, where it has one: the same call on a
// one-element host tensor of that dtype raises CPU's own error (an empty one would not: CPU
// checks the dtype only when there is something to fill).
template <typename F>
void refuse_dtype_as_cpu(const at::Tensor& self, bool refused, F sample) {
  if (refused) {
    auto host = at::empty({1}, self.options().device(at::kCPU));
    sample(host);
  }
}

at::Tensor& exponential_(at::Tensor& self, double lambd, std::optional<at::Generator> gen) {
  refuse_dtype_as_cpu(self, !at::isFloatingType(self.scalar_type()),
                      [&](at::Tensor& h) { h.exponential_(lambd); });
  TORCH_CHECK(lambd > 0.0, "exponential_ expects lambda > 0.0, but found lambda=", lambd);
  if (self.numel() == 0) return self;
  auto u = draw(self.sizes(), transform_dtype(self), Dist::Uniform, gen);
  // 1 - u is in (0, 1], so the log is finite.
  assign(self, at::log1p(-u) * (-1.0 / lambd));
  return self;
}

// cauchy_, log_normal_ and geometric_: CPU's transformations of one uniform or normal draw,
// on the device's generator (on the CPU fallback they drew from the CPU's, so a tpu generator
// raised and tpu seeds and states did not reproduce them).
at::Tensor& cauchy_(at::Tensor& self, double median, double sigma,
                    std::optional<at::Generator> gen) {
  refuse_dtype_as_cpu(self, !at::isFloatingType(self.scalar_type()),
                      [&](at::Tensor& h) { h.cauchy_(median, sigma); });
  TORCH_CHECK(sigma > 0.0, "cauchy_ expects sigma > 0.0, but found sigma=", sigma);
  if (self.numel() == 0) return self;
  auto u = draw(self.sizes(), transform_dtype(self), Dist::Uniform, gen);
  assign(self, at::tan((u - 0.5) * M_PI) * sigma + median);
  return self;
}

at::Tensor& log_normal_(at::Tensor& self, double mean, double std,
                        std::optional<at::Generator> gen) {
  refuse_dtype_as_cpu(self, !at::isFloatingType(self.scalar_type()),
                      [&](at::Tensor& h) { h.log_normal_(mean, std); });
  TORCH_CHECK(std > 0.0, "log_normal_ expects std > 0.0, but found std=", std);
  if (self.numel() == 0) return self;
  auto z = draw(self.sizes(), transform_dtype(self), Dist::Normal, gen);
  assign(self, at::exp(z * std + mean));
  return self;
}

at::Tensor& geometric_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  refuse_dtype_as_cpu(self, self.scalar_type() == at::kBool, [&](at::Tensor& h) { h.geometric_(p); });
  TORCH_CHECK(0 < p && p < 1, "geometric_ expects p to be in (0, 1), but got p=", p);
  if (self.numel() == 0) return self;
  auto u = draw(self.sizes(), at::isFloatingType(self.scalar_type()) ? transform_dtype(self)
                                                                       : at::kDouble,
                Dist::Uniform, gen);
  assign(self, at::ceil(at::log(u) / std::log1p(-p)));
  return self;
}

at::Tensor& bernoulli_scalar_(at::Tensor& self, double p, std::optional<at::Generator> gen) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "bernoulli_ expects p to be in [0, 1], but got p=", p);
  if (self.numel() == 0) return self;
  auto u = draw(self.sizes(), at::kDouble, Dist::Uniform, gen);
  assign(self, u.lt(p));
  return self;
}

// A CPU probability tensor is moved to the device first, as CUDA's kernel does.
at::Tensor& bernoulli_tensor_(at::Tensor& self, const at::Tensor& p_in,
                              std::optional<at::Generator> gen) {
  if (self.numel() == 0) return self;
  auto p = p_in.device().is_cpu() ? p_in.to(self.device()) : p_in;
  check_float_kernel(p.scalar_type(), "bernoulli_tensor_cpu_p_");
  auto u = draw(self.sizes(), at::kDouble, Dist::Uniform, gen);
  assign(self, u.lt(p));
  return self;
}

at::Tensor bernoulli(const at::Tensor& p, std::optional<at::Generator> gen) {
  auto out = at::empty_like(p);
  if (p.numel() == 0) return out;
  check_float_kernel(p.scalar_type(), "bernoulli_tensor_cpu_p_");
  auto u = draw(p.sizes(), at::kDouble, Dist::Uniform, gen);
  assign(out, u.lt(p));
  return out;
}

// Like PyTorch's CPU kernel: the mask keeps an element with probability 1 - p, survivors are
// scaled by 1 / (1 - p); outside training the input passes through with an all-true mask.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  TORCH_CHECK(p >= 0.0 && p <= 1.0, "dropout probability has to be between 0 and 1, but got ", p);
  // CPU scales in float and casts into the input's dtype, which an integer input refuses.
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  TORCH_CHECK(at::isFloatingType(input.scalar_type()) || at::isComplexType(input.scalar_type()) ||
              input.numel() == 0, "result type Float can't be cast to the desired output type ",
              c10::toString(input.scalar_type()));
  if (p == 1.0 || input.numel() == 0) {
    return {at::zeros_like(input), at::zeros_like(input, input.options().dtype(at::kBool))};
  }
  auto u = draw(input.sizes(), transform_dtype(input), Dist::Uniform, std::nullopt);
  auto mask = u.lt(1.0 - p);
  double scale = 1.0 / (1.0 - p);
  return {input * mask * scale, mask};
}

at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  return grad * mask * scale;
}

// A random permutation: the indices that sort n uniform numbers.
at::Tensor& randperm_out(int64_t n, std::optional<at::Generator> gen, at::Tensor& out) {
  TORCH_CHECK(n >= 0, "randperm: n must be non-negative, got ", n);
  // CPU's own check that the largest index fits the dtype (its message per dtype).
  at::scalar_tensor(n > 0 ? n - 1 : n, out.options().device(at::kCPU));
  TORCH_CHECK_NOT_IMPLEMENTED(out.scalar_type() != at::kBool,
                              "\"randperm\" not implemented for 'Bool'");
  // CPU's precision checks (check_supported_max_int_with_precision): past these a float type
  // cannot hold every index, and the result would repeat values.
  switch (out.scalar_type()) {
    case at::kHalf:
      TORCH_CHECK(n <= (int64_t(1) << 11) + 1, "n cannot be greater than 2049 for Half type.");
      break;
    case at::kFloat:
      TORCH_CHECK(n <= (int64_t(1) << 24) + 1, "n cannot be greater than 2^24+1 for Float type.");
      break;
    case at::kDouble:
      TORCH_CHECK(n <= (int64_t(1) << 53) + 1, "n cannot be greater than 2^53+1 for Double type.");
      break;
    default:
      break;
  }
  out.resize_({n});
  if (n == 0) return out;
  auto u = draw({n}, at::kDouble, Dist::Uniform, gen);
  assign(out, std::get<1>(at::sort(u, /*stable=*/true, 0, false)));
  return out;
}

// multinomial as PyTorch draws it, on the device's numbers: with replacement, each sample is
// the insertion point of a uniform number in the normalised cumulative distribution (a
// zero-probability category is never chosen); without, the k largest of p / q for exponential
// q (CPU's exponential-race trick). CPU's checks of the probabilities' values (non-negative,
// finite, not all zero) would each need a sync; they are not made.
at::Tensor multinomial(const at::Tensor& self, c10::SymInt num_samples, bool replacement,
                       std::optional<at::Generator> gen) {
  int64_t k = num_samples.expect_int();
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, "prob_dist must be 1 or 2 dim, got ",
              self.dim());
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point "
              "dtypes for input, got: ", self.scalar_type());
  TORCH_CHECK(k > 0, "cannot sample n_sample <= 0 samples");
  int64_t n = self.size(-1);
  TORCH_CHECK(replacement || k <= n, "cannot sample n_sample > prob_dist.size(-1) samples "
              "without replacement");
  TORCH_CHECK(n <= (int64_t(1) << 24), "number of categories cannot exceed 2^24");
  auto p = self.dim() == 1 ? self.unsqueeze(0) : self;
  at::Tensor idx;
  if (replacement) {
    auto cdf = at::cumsum(p, -1, at::kDouble);
    cdf = cdf / cdf.narrow(-1, n - 1, 1);
    auto u = draw({p.size(0), k}, at::kDouble, Dist::Uniform, gen);
    idx = at::clamp_max(at::searchsorted(cdf, u, false, true), n - 1);
  } else {
    auto q = at::log1p(-draw(p.sizes(), at::kDouble, Dist::Uniform, gen)).neg();
    idx = std::get<1>(at::topk(p.to(at::kDouble) / q, k, -1));
  }
  return self.dim() == 1 ? idx.squeeze(0) : idx;
}

// The default generator's controls for torch.tpu.manual_seed / seed / initial_seed /
// get_rng_state / set_rng_state (Python reaches them as torch.ops.deferfuse.*).
TpuGeneratorImpl* default_impl() {
  return at::check_generator<TpuGeneratorImpl>(default_generator());
}

void manual_seed(int64_t seed) {
  auto* g = default_impl();
  std::lock_guard<std::mutex> lock(g->mutex_);
  g->set_current_seed(static_cast<uint64_t>(seed));
}

int64_t seed() {
  auto* g = default_impl();
  std::lock_guard<std::mutex> lock(g->mutex_);
  return static_cast<int64_t>(g->seed());
}

int64_t initial_seed() {
  auto* g = default_impl();
  std::lock_guard<std::mutex> lock(g->mutex_);
  return static_cast<int64_t>(g->current_seed());
}

at::Tensor get_rng_state() {
  auto* g = default_impl();
  std::lock_guard<std::mutex> lock(g->mutex_);
  return at::Tensor(g->get_state());
}

void set_rng_state(const at::Tensor& state) {
  auto* g = default_impl();
  std::lock_guard<std::mutex> lock(g->mutex_);
  g->set_state(*state.unsafeGetTensorImpl());
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_FRAGMENT(deferfuse, m) {
  m.def("manual_seed(int seed) -> ()", &dft::manual_seed);
  m.def("seed() -> int", &dft::seed);
  m.def("initial_seed() -> int", &dft::initial_seed);
  m.def("get_rng_state() -> Tensor", &dft::get_rng_state);
  m.def("set_rng_state(Tensor state) -> ()", &dft::set_rng_state);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("uniform_", DFT_GROUPED(dft::uniform_));
  m.impl("normal_", DFT_GROUPED(dft::normal_));
  m.impl("normal.Tensor_Tensor", DFT_GROUPED(dft::normal_tensor_tensor));
  m.impl("normal.Tensor_float", DFT_GROUPED(dft::normal_tensor_float));
  m.impl("normal.float_Tensor", DFT_GROUPED(dft::normal_float_tensor));
  m.impl("random_", TORCH_FN(dft::random_));
  m.impl("random_.from", DFT_GROUPED(dft::random_from));
  m.impl("random_.to", TORCH_FN(dft::random_to));
  m.impl("exponential_", TORCH_FN(dft::exponential_));
  m.impl("cauchy_", TORCH_FN(dft::cauchy_));
  m.impl("log_normal_", TORCH_FN(dft::log_normal_));
  m.impl("geometric_", TORCH_FN(dft::geometric_));
  m.impl("bernoulli_.float", DFT_GROUPED(dft::bernoulli_scalar_));
  m.impl("bernoulli_.Tensor", TORCH_FN(dft::bernoulli_tensor_));
  m.impl("bernoulli", DFT_GROUPED(dft::bernoulli));
  m.impl("native_dropout", DFT_GROUPED(dft::native_dropout));
  m.impl("native_dropout_backward", DFT_GROUPED(dft::native_dropout_backward));
  m.impl("multinomial", DFT_GROUPED(dft::multinomial));
  m.impl("randperm.generator_out", TORCH_FN(dft::randperm_out));
}
