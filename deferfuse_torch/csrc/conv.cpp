// Convolution (1-D, 2-D, 3-D; stride, padding, dilation, groups, bias; plain and transposed)
// forward and backward as im2col + GEMM: the padded input's windows are a free as_strided view
// [N, C, k..., out...], copied once into columns laid out [C, k..., N, out...] and multiplied by
// the weight viewed as [G, OCg, Cg*K]. That layout lets every GEMM read its operands as strided
// views: per sample when a sample has many output positions, else with the batch folded into
// the GEMM's columns (see kGemmPerSampleFromPositions). The input gradient is W^T @
// grad_output scattered back by the runtime's col2im (columns_to_input; float32) or else by
// add_windows (K in-place strided adds, no scatter op needed);
// the weight gradient is one GEMM of grad_output with the columns over the batch. On maps of
// 256+ output positions a sample (36+ for a small weight), the forward and the weight
// gradient run on the runtime's convolution op instead (on_conv_op), which writes no columns
// at all, and so does the input gradient at stride 1 (input_grad_as_conv). A transposed
// convolution is the input gradient of the plain convolution whose weight it shares, so it
// reuses the same three pieces with the roles of input and output swapped.
//
// A depthwise convolution (one input and one output channel per group: MobileNet, EfficientNet,
// ConvNeXt) has no contraction to speak of: im2col copies K values per input element for a
// product of one row, and a sum over the kernel taps of shifted views is K loads per output
// element through as many views. Its forward and both gradients are the runtime's depthwise
// kernel op instead (DFUSE_OP_KIND_DEPTHWISE_CONV), which reads each channel's few rows from
// cache (ConvNeXt's 7x7 at 8x48x16x16, forward and backward: see the README).
#include "windows.h"

#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include <algorithm>
#include <deque>
#include <mutex>
#include <sstream>

namespace dft {
namespace {

struct Geometry {
  int64_t N, C, OC, G, Cg, OCg, K, L;
  std::vector<int64_t> in, kernel, stride, padding, dilation, out;
};

// CPU's check, which PyTorch's shared convolution checks leave to the backend (they refuse
// only negative dilations): a dilation of 0 computed windows of one tap.
void check_dilation(const std::vector<int64_t>& dilation) {
  TORCH_CHECK(std::all_of(dilation.begin(), dilation.end(), [](int64_t v) { return v > 0; }),
              "dilation should be greater than zero, but got ", at::IntArrayRef(dilation));
}

// CPU's dtype checks, which PyTorch leaves to the backend: an input, weight and bias of one
// dtype (autocast casts them to one first). Mixed, some geometries computed in the input's
// dtype and others failed with an internal message.
void check_same_dtypes(const at::Tensor& x, const at::Tensor& w,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "Input type (", x.toString(),
              ") and weight type (", w.toString(),
              ") should be the same or input should be a MKLDNN tensor and weight is a dense "
              "tensor");
  TORCH_CHECK(!bias || !bias->defined() || bias->scalar_type() == x.scalar_type(),
              "Input type (", x.dtype(), ") and bias type (", bias->dtype(),
              ") should be the same");
}

// The plain convolution of an input of shape x [N, C, spatial...] by w [OC, C / groups, k...].
Geometry geometry(at::IntArrayRef x, const at::Tensor& w, at::IntArrayRef stride,
                  at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  int64_t d = static_cast<int64_t>(x.size()) - 2;
  TORCH_CHECK(d >= 1 && d <= 3, "tpu: convolution expects a 3-D, 4-D or 5-D input [N, C, ...], got "
              "shape ", x);
  TORCH_CHECK(w.dim() == d + 2, "tpu: convolution weight of shape ", w.sizes(),
              " does not match an input of shape ", x);
  Geometry g;
  g.N = x[0];
  g.C = x[1];
  g.OC = w.size(0);
  g.G = groups;
  TORCH_CHECK(groups > 0 && g.C % groups == 0 && g.OC % groups == 0,
              "tpu: convolution groups=", groups, " must divide the input channels ", g.C,
              " and output channels ", g.OC);
  g.Cg = g.C / groups;
  g.OCg = g.OC / groups;
  TORCH_CHECK(w.size(1) == g.Cg, "tpu: convolution weight of shape ", w.sizes(), " expects ",
              w.size(1) * groups, " input channels, got ", g.C);
  g.stride = expand_param(stride, d, "convolution", "stride");
  g.padding = expand_param(padding, d, "convolution", "padding");
  g.dilation = expand_param(dilation, d, "convolution", "dilation");
  check_dilation(g.dilation);
  g.K = 1;
  g.L = 1;
  for (int64_t i = 0; i < d; ++i) {
    g.in.push_back(x[2 + i]);
    g.kernel.push_back(w.size(2 + i));
    int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    int64_t o = (g.in[i] + 2 * g.padding[i] - span) / g.stride[i] + 1;
    TORCH_CHECK(g.in[i] + 2 * g.padding[i] >= span && o > 0, "tpu: convolution kernel of size ",
                w.sizes().slice(2), " (dilation ", dilation, ") is larger than the padded input ",
                x.slice(2));
    g.out.push_back(o);
    g.K *= g.kernel[i];
    g.L *= o;
  }
  return g;
}

std::vector<int64_t> padded_sizes(const Geometry& g) {
  std::vector<int64_t> s;
  for (size_t i = 0; i < g.in.size(); ++i) s.push_back(g.in[i] + 2 * g.padding[i]);
  return s;
}

std::vector<int64_t> with_spatial(int64_t n, int64_t c, const std::vector<int64_t>& spatial) {
  std::vector<int64_t> s{n, c};
  s.insert(s.end(), spatial.begin(), spatial.end());
  return s;
}

// Output positions per sample from which each sample gets a GEMM of its own (written straight
// into the [N, OC, out...] result). Below it the batch is folded into the GEMM's columns
// (N * L of them) and the result transposed once: a GEMM per sample re-packs the whole weight
// for a handful of columns (resnet18's layer 4, 512 x 4608 by 4, ran at 5 GFLOP/s).
constexpr int64_t kGemmPerSampleFromPositions = 256;

bool per_sample(const Geometry& g) { return g.N == 1 || g.L >= kGemmPerSampleFromPositions; }

// Columns and their input gradient are laid out [C, k..., N, out...]: the contraction dims
// (C, k...) and the positions (N, out...) are each one stride apart, so GEMMs read them as
// [G, Cg*K, N*L] (or per sample) without a copy. This permutes that layout's dims into the
// window order [N, C, k..., out...].
std::vector<int64_t> columns_to_window(const Geometry& g) {
  int64_t d = g.kernel.size();
  std::vector<int64_t> p{d + 1, 0};
  for (int64_t i = 0; i < d; ++i) p.push_back(1 + i);
  for (int64_t i = 0; i < d; ++i) p.push_back(d + 2 + i);
  return p;
}

std::vector<int64_t> columns_sizes(const Geometry& g) {
  std::vector<int64_t> s{g.C};
  s.insert(s.end(), g.kernel.begin(), g.kernel.end());
  s.push_back(g.N);
  s.insert(s.end(), g.out.begin(), g.out.end());
  return s;
}

// The conv op's attributes for `part` of geometry g with `padding`, the kernel sizes in `dims`
// (the weight gradient and im2col read them there: their operands do not hold them; col2im's
// caller puts the input's sizes there instead).
DfuseAttrs conv_op_attrs(const Geometry& g, uint32_t part, const std::vector<int64_t>& padding) {
  DfuseAttrs a = attrs_sub(part);
  a.n_dims = g.kernel.size();
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    a.dims[i] = g.kernel[i];
    a.padding[i] = padding[i];
    a.dilation[i] = g.dilation[i];
    a.stride[i] = g.stride[i];
  }
  return a;
}

// Kernel taps from which columns come from the runtime's im2col routine
// (DFUSE_CONV_PART_INPUT_TO_COLUMNS: each (n, c) plane padded in cache, its taps copied out)
// instead of a padded copy of x and the JIT's window copy. One thread, best of 15 side by side
// (window copy -> routine): 4x4 stride-2 columns of [64, 32, 14, 14] 4.5-4.7 -> 2.8-3.4 ms and
// of [32, 64, 8, 8] 1.3-2.0 -> 1.1-1.4; LeNet's 5x5 of [128, 6, 14, 14] 1.8-1.85 -> 0.9-1.0.
// With 3x3 kernels the window copy's walk (rows merged where short) was as fast or faster:
// [8, 256, 8, 8] 0.6-1.0 -> 1.1, [8, 512, 4, 4] 0.4-0.8 -> 0.8-1.2.
constexpr int64_t kMinTapsForColumnsRoutine = 16;

// Whether every window the input holds is a column: not so for a transposed convolution
// whose output_padding (at or past its stride, allowed below the dilation) leaves room for
// more windows than its input has positions (transposed_geometry keeps those).
bool all_windows(const Geometry& g) {
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    if ((g.in[i] + 2 * g.padding[i] - span) / g.stride[i] + 1 != g.out[i]) return false;
  }
  return true;
}

// Whether x's columns come from the routine: float32 or a half type (it copies bit patterns),
// every window a column, and many taps or a kernel along one dim only (a 1-D convolution, run
// as 2-D with a height of 1): there the window copy walks each tap's long row element by
// element, and at a stride the routine gathers every other element with vector shuffles (an
// audio encoder's bf16 k3 stride-2 columns, [8, 128, 1599] -> [128, 3, 8, 799]: 1.3 -> 0.8 ms).
bool columns_from_routine(const at::Tensor& x, const Geometry& g) {
  const auto dtype = x.scalar_type();
  const bool copyable = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  const bool one_dim = *std::max_element(g.kernel.begin(), g.kernel.end()) == g.K;
  return copyable && (g.K >= kMinTapsForColumnsRoutine || one_dim) && all_windows(g);
}

// im2col: x's windows copied once into columns [G, Cg*K, N, L]. `ones_row`: one more row of
// ones after each group's columns, [G, Cg*K + 1, N, L] (see conv_forward's bias), the window
// copy's own columns unchanged.
at::Tensor columns(const at::Tensor& x, const Geometry& g, bool ones_row = false) {
  if (columns_from_routine(x, g)) {
    auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_INPUT_TO_COLUMNS, g.padding);
    if (!ones_row) {
      auto cols = run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(x), "convolution");
      return cols.view({g.G, g.Cg * g.K, g.N, g.L});
    }
    if (g.G == 1) {
      // The routine writes the rows above the ones in place (with groups, a group's rows
      // are no one stride apart from the next group's).
      auto all = at::empty({1, g.Cg * g.K + 1, g.N, g.L}, x.options());
      all.narrow(1, g.Cg * g.K, 1).fill_(1);
      run_into(DFUSE_OP_KIND_CONV, &attrs, Operands().t(x),
               all.narrow(1, 0, g.Cg * g.K).view(columns_sizes(g)), "convolution");
      return all;
    }
  }
  const int64_t rows = g.Cg * g.K;
  auto all = at::empty({g.G, rows + (ones_row ? 1 : 0), g.N, g.L}, x.options());
  if (ones_row) all.narrow(1, rows, 1).fill_(1);
  auto xp = pad_spatial(x, g.padding, g.padding, 0);
  auto windows = window_view(xp, g.kernel, g.stride, g.dilation, g.out);
  if (!ones_row || g.G == 1) {
    auto cols = all.narrow(1, 0, rows).view(columns_sizes(g));
    copy_windows(cols.permute(columns_to_window(g)), windows, g.kernel.size());
    return all;
  }
  // With groups the ones row lies between one group's rows and the next's, so the channels
  // are no one stride apart: a copy per group (viewed as one, the grouped half-precision
  // convolutions with a bias raised).
  auto group_sizes = columns_sizes(g);
  group_sizes[0] = g.Cg;
  for (int64_t i = 0; i < g.G; ++i) {
    auto cols = all[i].narrow(0, 0, rows).view(group_sizes);
    copy_windows(cols.permute(columns_to_window(g)), windows.narrow(1, i * g.Cg, g.Cg),
                 g.kernel.size());
  }
  return all;
}

// The forward's columns, kept for the weight gradient: recomputing them is a second im2col
// (padding + window copy) per convolution in backward. Kept only while autograd may ask (grad
// mode on, weight requiring grad); matched to the input by identity (a weak reference, so a
// freed input whose address another tensor reuses never matches), version (an in-place write
// invalidates them) and geometry; dropped when taken; bounded in bytes (past the bound the
// oldest go, and backward recomputes what it does not find).
class ColumnsCache {
 public:
  // Keeps `cols` as x's columns for one more backward. A forward of an input already here
  // (the same version and geometry: a fixed batch evaluated again, one input through several
  // weights) replaces the entry's columns with its own and counts one more use instead of
  // adding a copy: the copies piled up to the bound, each a fresh allocation, while that input
  // lived (a repeated [8, 128, 8, 8] forward ran 1.4 ms where 0.6 ms is its work). The newest
  // columns, because a write that bumps no version (`x.data.copy_(batch)`, `x.data = batch`)
  // changes x for every backward still to run, as autograd's saved x sees it too; a forward
  // never reuses kept columns, since such a write is invisible here.
  void put(const at::Tensor& x, const Geometry& g, const at::Tensor& cols) {
    std::lock_guard<std::mutex> lock(mu_);
    // An entry no backward can take any more goes: its input was freed, or written since
    // (versions only grow; a buffer refilled in place before each forward, as an evaluation
    // loop's, kept one entry per forward until the bound).
    std::erase_if(entries_, [&](const Entry& e) {
      auto alive = e.input.lock();
      bool stale = !alive || alive->version_counter().current_version() != e.version;
      if (stale) bytes_ -= e.bytes;
      return stale;
    });
    auto k = key(x, g);
    auto same = find_entry(x, k);
    if (same != entries_.end()) {
      same->cols = cols;
      ++same->uses;
      return;
    }
    size_t bytes = cols.numel() * cols.element_size();
    if (bytes > kBytes) return;
    while (!entries_.empty() && bytes_ + bytes > kBytes) {
      bytes_ -= entries_.front().bytes;
      entries_.pop_front();
    }
    entries_.push_back({c10::weak_intrusive_ptr<c10::TensorImpl>(x.getIntrusivePtr()),
                        x._version(), std::move(k), cols, bytes, 1});
    bytes_ += bytes;
  }

  // The columns put for this x and geometry, for one backward (the entry goes with its last
  // use), or an undefined tensor.
  at::Tensor take(const at::Tensor& x, const Geometry& g) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = find_entry(x, key(x, g));
    if (it == entries_.end()) return at::Tensor();
    auto cols = it->cols;
    if (--it->uses == 0) {
      bytes_ -= it->bytes;
      entries_.erase(it);
    }
    return cols;
  }

 private:
  static constexpr size_t kBytes = size_t(256) << 20;

  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl> input;
    uint32_t version;
    std::vector<int64_t> key;
    at::Tensor cols;
    size_t bytes;
    size_t uses;  // forwards whose backward may take these columns
  };

  // The live entry of x (this version) with key k. Called with mu_ held.
  std::deque<Entry>::iterator find_entry(const at::Tensor& x, const std::vector<int64_t>& k) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      auto alive = it->input.lock();
      if (alive.get() == x.unsafeGetTensorImpl() && it->version == x._version() && it->key == k) {
        return it;
      }
    }
    return entries_.end();
  }

  // What, besides the input's identity and version, decides the columns: the geometry, and
  // the storage's values as its handle (a `.data.copy_` from the host may adopt a new one) and
  // its write count (writes through `.data` bump no version: the backward took columns of
  // the values before them, where CPU's reads the new ones).
  static std::vector<int64_t> key(const at::Tensor& x, const Geometry& g) {
    std::vector<int64_t> k(x.sizes().begin(), x.sizes().end());
    const StorageCtx* c = find_storage_ctx(x);
    k.push_back(c != nullptr ? static_cast<int64_t>(c->handle) : 0);
    k.push_back(c != nullptr ? static_cast<int64_t>(c->writes) : -1);
    k.insert(k.end(), x.strides().begin(), x.strides().end());
    k.push_back(x.storage_offset());
    k.push_back(g.G);
    for (const auto* v : {&g.kernel, &g.stride, &g.padding, &g.dilation}) {
      k.insert(k.end(), v->begin(), v->end());
    }
    return k;
  }

  std::mutex mu_;
  std::deque<Entry> entries_;
  size_t bytes_ = 0;
};

ColumnsCache& columns_cache() {
  static ColumnsCache cache;
  return cache;
}

// t [N, OC, out...] with its positions major: [G, OCg, N*L] (a copy), the layout the folded
// GEMMs take the output gradient in.
at::Tensor positions_major(const at::Tensor& t, const Geometry& g) {
  return t.reshape({g.N, g.G, g.OCg, g.L}).permute({1, 2, 0, 3}).reshape({g.G, g.OCg, g.N * g.L});
}

// A 1x1 kernel at stride 1 without padding (MobileNet's and EfficientNet's pointwise
// convolutions): each position's window is the position itself, so W^T @ grad is the input
// gradient as it stands, with nothing to scatter or gather. Not so when the input is longer
// than the output: a transposed convolution's output_padding (below its dilation) adds
// positions no window holds, and taking its 4 windows as a 5-long input raised.
bool whole_window(const Geometry& g) {
  if (g.K != 1) return false;
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    if (g.stride[i] != 1 || g.padding[i] != 0 || g.in[i] != g.out[i]) return false;
  }
  return true;
}

// Whether this convolution's forward and weight gradient run on the runtime's dense
// convolution op (DFUSE_OP_KIND_CONV), which never writes columns: blocks of them are copied
// from a padded copy of the sample (split by phase where strided) right before their product.
// It needs one group, float32, a kernel that is more than the position itself (whole_window),
// and enough positions per sample: the op multiplies sample by sample, so a small map is a
// product of few columns that reads the whole weight per sample (resnet18's 8x8 to 2x2 layers
// at batch 8 ran 1.3x slower that way than folded into one product); from
// kGemmPerSampleFromPositions on (kConvOpSmallWeightFromPositions for a weight that stays in
// cache), the products per sample are wide enough. A strided one takes the op only where its
// columns would be kMinStridedColumnsPerInput or more values per input value (K over the
// strides' product): below that, im2col's copy is cheap and the product reading packed columns
// was as fast or faster (one thread, im2col -> op: a 7x7 stride-2 stem, [8, 3, 64, 64] by [64,
// 3, 7, 7], forward 2.5-3.2 -> 1.5 ms and weight gradient 2.6 -> 1.7-1.9, resnet18's step 118.5
// -> 115 ms; an audio encoder's k3 stride-2 [8, 128, 1599] by [128, 128, 3], 1.5 values per
// input value, forward 6.7 -> 7.9, and its step no faster). A strided convolution's input
// gradient is not a convolution of that kind (input_grad_as_conv).
constexpr double kMinStridedColumnsPerInput = 4.0;

// A weight this small (elements; 384 KB of float32) stays in cache while the op multiplies
// sample by sample, so the op pays for itself from far fewer positions a sample than
// kGemmPerSampleFromPositions, where the folded product's im2col copy and col2im scatter are
// most of the work. One thread, forward and both gradients, folded -> op (ms): a conv-4
// few-shot net's [75, 32, 14, 14] by 32x32x3x3 11.7 -> 5.9 and at 7x7 2.6 -> 1.9, [32, 16, 14,
// 14] 1.46 -> 0.70, [8, 48, 12, 12] 1.16 -> 0.95, [16, 64, 14, 14] to 128 8.6 -> 7.7, [16, 96,
// 8, 8] 3.49 -> 3.35; below 36 positions the folded product won (5x5 2.2 vs 2.5, 3x3 1.2 vs
// 1.5), and so it did for larger weights (128 -> 128 at 8x8, 576 KB: 5.2 vs 5.7; 256 -> 256
// at 4x4 2.3 vs 4.3).
constexpr int64_t kConvOpSmallWeightMaxElems = 96 * 1024;
constexpr int64_t kConvOpSmallWeightFromPositions = 36;

bool unit_stride(const Geometry& g) {
  return std::all_of(g.stride.begin(), g.stride.end(), [](int64_t s) { return s == 1; });
}

bool on_conv_op(const Geometry& g, at::ScalarType dtype) {
  if (g.G != 1 || dtype != at::kFloat) return false;
  if (whole_window(g)) return false;
  bool small_weight = g.OC * g.Cg * g.K <= kConvOpSmallWeightMaxElems;
  if (g.L < (small_weight ? kConvOpSmallWeightFromPositions : kGemmPerSampleFromPositions)) {
    return false;
  }
  double strides = 1;  // 1 exactly at unit stride (each stride is at least 1)
  for (auto s : g.stride) strides *= s;
  return strides == 1 || double(g.K) / strides >= kMinStridedColumnsPerInput;
}

// Whether a float16/bfloat16 convolution's forward and weight gradient run on the conv op
// (on_conv_op of its float32 twin): bfloat16 operands summed by the op in float32 on
// AVX512-BF16's pair dot products, float16 ones widened to float32 first (exactly); the result
// rounded once, as CPU's kernels and the half-precision GEMM also sum. float16 only with few
// output channels, the half-precision products' rows: at 16 the bf16 GEMM packs B for two row
// tiles and ran at ~110 GFLOP/s, while the widened op runs at the float32 rate (one thread,
// bf16 GEMM -> widened op, ms: [4, 16, 64, 64] -> 16 forward 0.60 -> 0.51, weight gradient
// 0.66 -> 0.46; at 64 output channels the GEMM was faster, 0.33 -> 0.46). bfloat16 at any
// channel count: the op's bf16 products need no im2col copy and pack each panel of columns
// from the grid in L1 (U-Net autocast, 32 and 64 channels too: defer step 21.3-22.6 ->
// 15.5-15.8 ms; resnet18's 64-channel 16x16 layers: forward 0.96 -> 0.53 ms with the copy, its
// weight gradient 0.46 -> 0.57, the step 49.6-51.8 -> 47.4-48.4).
constexpr int64_t kWidenedMaxOutputChannels = 16;

// A weight of another dtype is not widened with x: it takes the products' path, which refuses
// it as CPU does.
bool widened_on_conv_op(const Geometry& g, const at::Tensor& x, const at::Tensor& w) {
  const auto dtype = x.scalar_type();
  return (dtype == at::kBFloat16 || (dtype == at::kHalf && g.OC <= kWidenedMaxOutputChannels)) &&
         w.scalar_type() == dtype && on_conv_op(g, at::kFloat);
}

// The operands a half-precision convolution hands the float32 conv op: bfloat16 ones as they
// are (the op sums their exact products in float32 on AVX512-BF16's dot-product instruction,
// twice the float32 rate, and returns float32), others widened to float32 first.
std::pair<at::Tensor, at::Tensor> conv_op_operands(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16) return {a, b};
  return {a.to(at::kFloat), b.to(at::kFloat)};
}

at::Tensor add_bias(const at::Tensor& out, const std::optional<at::Tensor>& bias) {
  if (!bias || !bias->defined()) return out;
  std::vector<int64_t> shape(out.dim(), 1);
  shape[1] = out.size(1);
  return out + bias->view(shape);
}

// conv(x, w) + bias: [N, OC, out...]. `keep`: a plain convolution's forward, whose columns
// its weight gradient can reuse; `given`: x's columns where the caller has them already.
//
// A float16/bfloat16 bias joins the float32 sums before their one rounding, as on CPU: on the
// widened conv op it is added to the float32 result; in the products it is one more term of
// every sum (a column of the weight against a row of ones in the columns). Added after the
// rounding, a result that nearly cancels the bias was off by up to 256 units in its last place
// (CPU: 0.5).
at::Tensor conv_forward(const at::Tensor& x, const at::Tensor& w, const Geometry& g,
                        bool keep = false, const at::Tensor& given = at::Tensor(),
                        const std::optional<at::Tensor>& bias = std::nullopt) {
  if (on_conv_op(g, x.scalar_type())) {
    auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_FORWARD, g.padding);
    return add_bias(run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(x).t(w), "convolution"), bias);
  }
  const auto dtype = x.scalar_type();
  const bool has_bias = bias && bias->defined();
  if (!given.defined() && widened_on_conv_op(g, x, w)) {
    auto [a, b] = conv_op_operands(x, w);
    auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_FORWARD, g.padding);
    auto wide = run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(a).t(b), "convolution");
    return add_bias(wide, has_bias ? std::optional<at::Tensor>(bias->to(at::kFloat)) : bias)
        .to(dtype);
  }
  const bool bias_term = has_bias && !given.defined() && w.scalar_type() == dtype &&
                         bias->scalar_type() == dtype &&
                         (dtype == at::kHalf || dtype == at::kBFloat16);
  const int64_t rows = g.Cg * g.K + (bias_term ? 1 : 0);
  auto all = given.defined() ? given : columns(x, g, bias_term);
  if (keep && at::GradMode::is_enabled() && w.requires_grad()) {
    columns_cache().put(x, g, all.narrow(1, 0, g.Cg * g.K));
  }
  auto wm = w.reshape({g.G, g.OCg, g.Cg * g.K});
  if (bias_term) wm = at::cat({wm, bias->reshape({g.G, g.OCg, 1})}, 2);
  auto shape = with_spatial(g.N, g.OC, g.out);
  at::Tensor out;
  if (per_sample(g)) {
    out = batched_matmul(wm, all.permute({2, 0, 1, 3})).view(shape);  // [N, G, OCg, L]
  } else {
    auto folded = batched_matmul(wm, all.view({g.G, rows, g.N * g.L}));  // [G, OCg, N*L]
    out = at::empty(shape, x.options());
    out.view({g.N, g.OC, g.L}).copy_(folded.view({g.OC, g.N, g.L}).transpose(0, 1));
  }
  return bias_term ? out : add_bias(out, bias);
}

// Per spatial dim, the padding of the gradient whose convolution by the flipped weight is the
// input gradient at stride 1: span - 1 - padding.
std::vector<int64_t> input_grad_padding(const Geometry& g) {
  std::vector<int64_t> q;
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    q.push_back(g.dilation[i] * (g.kernel[i] - 1) - g.padding[i]);
  }
  return q;
}

// Whether the input gradient runs on the conv op (on_conv_op) as the gradient's convolution
// by the weight transposed and flipped, which writes neither W^T @ grad's Cin * K values per
// position nor add_windows' K read-modify-write passes over the input (one thread, [4, C, H,
// W] by a 3x3 C -> C weight: C 16 at 64x64 4.3 -> 1.8 ms, C 32 at 32x32 2.5 -> 1.35, C 64 at
// 16x16 1.6 -> 1.1; the U-Net's defer step 65-69 -> 57 ms). Besides on_conv_op it needs
// stride 1, a padding of at most span - 1 (the gradient's own padding is then not negative)
// and an input of exactly the size that stride-1 convolution gives (a transposed
// convolution's output_padding can make it longer).
// `dtype`: the dtype the gradient will have there (grad's own unless widened first).
bool input_grad_as_conv(const Geometry& g, const at::Tensor& grad,
                        std::optional<at::ScalarType> dtype = std::nullopt) {
  if (!on_conv_op(g, dtype.value_or(grad.scalar_type())) || !unit_stride(g)) return false;
  auto q = input_grad_padding(g);
  for (size_t i = 0; i < q.size(); ++i) {
    int64_t span = g.dilation[i] * (g.kernel[i] - 1) + 1;
    if (q[i] < 0 || g.in[i] != grad.size(2 + i) + 2 * q[i] - (span - 1)) return false;
  }
  return true;
}

// d conv(x, w) / dx as input_grad_as_conv says: the op reads w [OC, C, k...] transposed with
// its taps reversed (DFUSE_CONV_PART_INPUT_GRAD), so no transposing or flipping op runs first.
at::Tensor input_grad_by_conv(const at::Tensor& grad, const at::Tensor& w, const Geometry& g) {
  auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_INPUT_GRAD, input_grad_padding(g));
  return run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(grad).t(w), "convolution");
}

// d conv(x, w) / dw on the conv op (on_conv_op): the same blocks of columns as the forward,
// each multiplied by its positions' gradient, so the weight gradient needs no columns either
// (and the forward keeps none for it).
at::Tensor weight_grad_by_conv(const at::Tensor& grad, const at::Tensor& x, const Geometry& g) {
  auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_WEIGHT_GRAD, g.padding);
  return run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(grad).t(x), "convolution");
}

// Whether the runtime's col2im (DFUSE_CONV_PART_COLUMNS_TO_INPUT) adds the columns' gradient
// back: float32, and every window the input holds a column (all_windows: the windows then
// cover the padded input but for less than a stride, as the op requires). Where not,
// add_windows' K strided adds do the same sums in the same order. Strided adds over a
// few-element rows were 1.4 ns an element: a VAE's 4x4 stride-2 transposed convolution
// [64, 64, 7, 7] -> [64, 32, 14, 14] spent 2.4 ms in them.
bool columns_to_input_fits(const Geometry& g, at::ScalarType dtype) {
  if (dtype != at::kFloat || !all_windows(g)) return false;
  // The op also needs the windows to reach past both paddings (the runtime's
  // infer_columns_to_input): one window of 2 over a 1-long input padded by 1 covers 2 * padding
  // positions, and the op refused it in backward.
  for (size_t i = 0; i < g.kernel.size(); ++i) {
    int64_t covered = (g.out[i] - 1) * g.stride[i] + g.dilation[i] * (g.kernel[i] - 1) + 1;
    if (covered <= 2 * g.padding[i]) return false;
  }
  return true;
}

// contrib [N, C, k..., out...] (any strides) added back into the input positions each tap
// read: [N, C, in...].
at::Tensor columns_to_input(const at::Tensor& contrib, const Geometry& g) {
  auto attrs = conv_op_attrs(g, DFUSE_CONV_PART_COLUMNS_TO_INPUT, g.padding);
  for (size_t i = 0; i < g.in.size(); ++i) attrs.dims[i] = g.in[i];
  return run(DFUSE_OP_KIND_CONV, &attrs, Operands().t(contrib), "convolution");
}

// d conv(x, w) / dx applied to grad [N, OC, out...]: [N, C, in...]. `go` is
// positions_major(grad), which the folded GEMM takes (undefined when per_sample(g) or
// input_grad_as_conv(g, grad)).
at::Tensor conv_input_grad(const at::Tensor& grad, const at::Tensor& go, const at::Tensor& w,
                           const Geometry& g);

// float16/bfloat16 windows that overlap are summed in float32 and rounded once, as CPU's
// kernels do: the product rounded to bfloat16 and then added window by window in bfloat16 erred
// by up to 0.17 of the result (a transposed convolution over 64 channels), against CPU's
// 0.004. True when grad's windows need it.
bool sums_windows_wide(const at::Tensor& grad, const Geometry& g) {
  const auto dtype = grad.scalar_type();
  return (dtype == at::kHalf || dtype == at::kBFloat16) && !whole_window(g);
}

// The input gradient [N, C, in...] from each window's contributions [N, C, k..., out...]: the
// product's own result where a window is the whole input (not a zero buffer plus one window
// added into it), else the windows added back where they overlap (col2im, or strided adds).
at::Tensor input_from_contributions(const at::Tensor& contrib, const Geometry& g) {
  auto in = with_spatial(g.N, g.C, g.in);
  // Where the batch was folded into the product's columns, copied out of their [C, N, L]
  // order into CPU's contiguous one (a permuted view made `.view()` of the gradient raise where
  // CPU's works), as the folded forward copies its output.
  if (whole_window(g)) return contrib.reshape(in).contiguous();
  if (columns_to_input_fits(g, contrib.scalar_type())) return columns_to_input(contrib, g);
  auto buf = add_windows(contrib, padded_sizes(g), g.kernel, g.stride, g.dilation);
  return buf.sizes().equals(in) ? buf : unpad_spatial(buf, g.padding, g.in).contiguous();
}

// Each window's contribution W^T @ grad, [N, C, k..., out...], by `product` (a matmul):
// per sample, or over the batch folded into the columns of `go` (positions_major(grad)).
template <typename Product>
at::Tensor contributions(const at::Tensor& grad, const at::Tensor& go, const at::Tensor& w,
                         const Geometry& g, Product product) {
  auto wt = w.reshape({g.G, g.OCg, g.Cg * g.K}).transpose(1, 2);
  std::vector<int64_t> window{g.N, g.C};
  window.insert(window.end(), g.kernel.begin(), g.kernel.end());
  window.insert(window.end(), g.out.begin(), g.out.end());
  if (per_sample(g)) return product(wt, grad.reshape({g.N, g.G, g.OCg, g.L})).view(window);
  return product(wt, go).view(columns_sizes(g)).permute(columns_to_window(g));
}

// conv_input_grad summed in float32, left unrounded: the caller rounds once, after adding
// anything else (a transposed convolution's bias). On the conv op bfloat16 operands are summed
// in float32 by the op itself, float16 ones widened first (conv_op_operands); elsewhere the
// contributions come from the half-precision product with float32 sums (wide_matmul: before,
// both operands were widened and multiplied at the float32 rate) and
// their windows are added in float32.
at::Tensor conv_input_grad_wide(const at::Tensor& grad, const at::Tensor& go, const at::Tensor& w,
                                const Geometry& g) {
  if (input_grad_as_conv(g, grad, at::kFloat)) {
    auto [a, b] = conv_op_operands(grad, w);
    return input_grad_by_conv(a, b, g);
  }
  return input_from_contributions(contributions(grad, go, w, g, wide_matmul), g);
}

at::Tensor conv_input_grad(const at::Tensor& grad, const at::Tensor& go, const at::Tensor& w,
                           const Geometry& g) {
  if (input_grad_as_conv(g, grad)) return input_grad_by_conv(grad, w, g);
  if (sums_windows_wide(grad, g)) {
    return conv_input_grad_wide(grad, go, w, g).to(grad.scalar_type());
  }
  return input_from_contributions(contributions(grad, go, w, g, batched_matmul), g);
}

// d conv(x, w) / dw applied to go = positions_major(grad): w's shape. One GEMM over all
// (sample, position) pairs: [G, OCg, N*L] @ [G, N*L, Cg*K], the columns read transposed.
// `given`: x's columns where the caller has them already.
at::Tensor conv_weight_grad(const at::Tensor& go, const at::Tensor& x, const at::Tensor& w,
                            const Geometry& g, const at::Tensor& given = at::Tensor()) {
  auto cols = given.defined() ? given : columns_cache().take(x, g);
  if (!cols.defined()) cols = columns(x, g);
  cols = cols.view({g.G, g.Cg * g.K, g.N * g.L});
  return batched_matmul(go, cols.transpose(1, 2)).view(w.sizes());
}

// A depthwise convolution: one input and one output channel per group, a float dtype.
bool is_depthwise(const Geometry& g, const at::Tensor& x) {
  return g.Cg == 1 && g.OCg == 1 && at::isFloatingType(x.scalar_type());
}

// The runtime's depthwise convolution op for `part` of geometry g.
DfuseAttrs depthwise_attrs(const Geometry& g, uint32_t part) {
  DfuseAttrs a = attrs_sub(part);
  size_t d = g.kernel.size();
  a.n_dims = d;
  for (size_t i = 0; i < d; ++i) {
    a.dims[i] = g.kernel[i];
    a.dims[d + i] = g.in[i];
    a.stride[i] = g.stride[i];
    a.padding[i] = g.padding[i];
    a.dilation[i] = g.dilation[i];
  }
  return a;
}

at::Tensor depthwise(const Geometry& g, uint32_t part, const at::Tensor& a, const at::Tensor& b) {
  auto attrs = depthwise_attrs(g, part);
  return run(DFUSE_OP_KIND_DEPTHWISE_CONV, &attrs, Operands().t(a).t(b), "convolution");
}

at::Tensor channel_sums(const at::Tensor& grad) {
  return reduce_but_channels(grad, DFUSE_REDUCE_OP_SUM);
}

// conv_transpose(x, w) with w [C_in, C_out / groups, k...] is the input gradient of the plain
// convolution of a [N, C_out, out...] input by w; out is the size whose plain convolution has
// x's spatial size, plus output_padding.
Geometry transposed_geometry(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
                             at::IntArrayRef padding, at::IntArrayRef dilation,
                             at::IntArrayRef output_padding, int64_t groups) {
  int64_t d = x.dim() - 2;
  TORCH_CHECK(d >= 1 && d <= 3 && w.dim() == x.dim(), "tpu: conv_transpose expects a 3-D, 4-D or "
              "5-D input and a weight of the same rank, got ", x.sizes(), " and ", w.sizes());
  TORCH_CHECK(w.size(0) == x.size(1), "tpu: conv_transpose weight of shape ", w.sizes(),
              " expects ", w.size(0), " input channels, got ", x.size(1));
  auto s = expand_param(stride, d, "conv_transpose", "stride");
  auto p = expand_param(padding, d, "conv_transpose", "padding");
  auto dil = expand_param(dilation, d, "conv_transpose", "dilation");
  auto op = expand_param(output_padding, d, "conv_transpose", "output_padding");
  check_dilation(dil);
  std::vector<int64_t> sizes{x.size(0), w.size(1) * groups};
  for (int64_t i = 0; i < d; ++i) {
    TORCH_CHECK(op[i] < s[i] || op[i] < dil[i], "tpu: conv_transpose output_padding ", op[i],
                " must be smaller than either stride ", s[i], " or dilation ", dil[i]);
    sizes.push_back((x.size(2 + i) - 1) * s[i] - 2 * p[i] + dil[i] * (w.size(2 + i) - 1) + op[i] +
                    1);
  }
  // CPU's error for an output with no positions (an empty result here before, or an
  // internal narrow() error when negative).
  if (std::any_of(sizes.begin() + 2, sizes.end(), [](int64_t v) { return v < 1; })) {
    std::ostringstream in, out;
    for (int64_t i = 0; i < d; ++i) {
      in << (i ? " x " : "") << x.size(2 + i);
      out << (i ? " x " : "") << sizes[2 + i];
    }
    TORCH_CHECK(false, "Given input size per channel: (", in.str(),
                "). Calculated output size per channel: (", out.str(),
                "). Output size is too small");
  }
  auto g = geometry(sizes, w, s, p, dil, groups);
  // An output_padding of at least the stride (allowed while below the dilation) leaves room
  // for more windows than x has positions; the windows are x's, the rest of the output only
  // padding.
  g.L = 1;
  for (int64_t i = 0; i < d; ++i) {
    g.out[i] = x.size(2 + i);
    g.L *= g.out[i];
  }
  return g;
}


// `t` [N, C, spatial...] cut to x's spatial sizes. A transposed convolution's output_padding
// of at least its stride (allowed below the dilation) leaves its output room for more windows
// than x has positions: the conv op's forward of the gradient computes those too (its size
// follows from the gradient's), and x's gradient is the first x.size(d) of them (autograd
// raised on the longer one).
at::Tensor crop_to(const at::Tensor& t, const at::Tensor& x) {
  bool cut = false;
  auto r = t;
  for (int64_t d = 2; d < t.dim(); ++d) {
    if (r.size(d) != x.size(d)) {
      r = r.narrow(d, 0, x.size(d));
      cut = true;
    }
  }
  return cut ? r.contiguous() : r;
}

at::Tensor convolution(const at::Tensor& x, const at::Tensor& w,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
                       at::IntArrayRef output_padding, int64_t groups) {
  check_same_dtypes(x, w, bias);
  const bool half_bias = bias && bias->defined() &&
                         (x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16);
  if (transposed) {
    auto g = transposed_geometry(x, w, stride, padding, dilation, output_padding, groups);
    bool folded = !per_sample(g) && !input_grad_as_conv(g, x);
    auto go = folded ? positions_major(x, g) : at::Tensor();
    if (half_bias) {
      // The bias joins the float32 sums before the one rounding, as on CPU (added after it,
      // the result erred ~2x CPU's; a 1x1 kernel's result that nearly cancels the bias, by a
      // whole unit of its magnitude).
      auto wide = conv_input_grad_wide(x, go, w, g);
      return add_bias(wide, bias->to(at::kFloat)).to(x.scalar_type());
    }
    return add_bias(conv_input_grad(x, go, w, g), bias);
  }
  auto g = geometry(x.sizes(), w, stride, padding, dilation, groups);
  if (is_depthwise(g, x)) {
    if (half_bias) {
      // As above: summed and biased in float32, rounded once (a depthwise result that nearly
      // cancels its bias came out 2.0 for CPU's 1.5 in bf16).
      auto wide = depthwise(g, DFUSE_DEPTHWISE_PART_FORWARD, x.to(at::kFloat), w.to(at::kFloat));
      return add_bias(wide, bias->to(at::kFloat)).to(x.scalar_type());
    }
    return add_bias(depthwise(g, DFUSE_DEPTHWISE_PART_FORWARD, x, w), bias);
  }
  return conv_forward(x, w, g, true, at::Tensor(), bias);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, bool transposed,
    at::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  at::Tensor gx, gw, gb;
  if (transposed) {
    // The transposed output is the plain convolution's input: the roles swap. Both gradients
    // read the columns of grad; made once for the two (a VAE's 4x4 stride-2 [64, 32, 14, 14]
    // gradient: two 1.6M-value copies in one 3.4-4.5 ms program before).
    auto g = transposed_geometry(x, w, stride, padding, dilation, output_padding, groups);
    at::Tensor cols;
    if (mask[0] && mask[1] && !on_conv_op(g, grad.scalar_type())) cols = columns(grad, g);
    if (mask[0]) gx = crop_to(conv_forward(grad, w, g, false, cols), x);
    if (mask[1]) gw = conv_weight_grad(positions_major(x, g), grad, w, g, cols);
  } else {
    auto g = geometry(x.sizes(), w, stride, padding, dilation, groups);
    if (is_depthwise(g, x)) {
      if (mask[0]) gx = depthwise(g, DFUSE_DEPTHWISE_PART_INPUT_GRAD, grad, w);
      if (mask[1]) gw = depthwise(g, DFUSE_DEPTHWISE_PART_WEIGHT_GRAD, grad, x);
    } else {
      at::Tensor go;
      bool op = on_conv_op(g, x.scalar_type());
      bool widened = widened_on_conv_op(g, x, w);
      bool folded_input_grad = mask[0] && !per_sample(g) && !input_grad_as_conv(g, grad);
      if ((mask[1] && !op && !widened) || folded_input_grad) go = positions_major(grad, g);
      if (mask[0]) gx = conv_input_grad(grad, go, w, g);
      if (mask[1] && widened) {
        auto [a, b] = conv_op_operands(grad, x);
        gw = weight_grad_by_conv(a, b, g).to(w.scalar_type());
      } else if (mask[1]) {
        gw = op ? weight_grad_by_conv(grad, x, g) : conv_weight_grad(go, x, w, g);
      }
    }
  }
  if (mask[2]) gb = channel_sums(grad);
  return {gx, gw, gb};
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", DFT_GROUPED(dft::convolution));
  m.impl("convolution_backward_overrideable", DFT_GROUPED(dft::convolution_backward));
}
