// Captured graphs for torch.compile (deferfuse_torch/compile_backend.py): a compiled graph's
// first call per input layout is recorded between graph_capture_begin and graph_capture_end,
// and every later call is one graph_launch, which runs the captured plan on the new inputs
// with no per-op dispatch (the runtime side is runtime/src/graph.rs).
//
// The runtime returns one handle per distinct output storage (a "base"); each output is a
// view of its base with the sizes, strides and offset the capture's output had, so outputs
// that shared a storage at capture share one at every launch.
#include "common.h"
#include "indexed_grad.h"
#include "streams.h"

#include <c10/util/strides.h>
#include <torch/library.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace dft {
namespace {

// How one output is made from a launch's bases.
struct OutputView {
  size_t base;
  bool whole;  // the base itself (the storage's own layout)
  std::vector<int64_t> sizes, strides;
  int64_t offset;
};

struct GraphOutputs {
  std::vector<OutputView> views;
  size_t n_bases;
};

std::mutex graphs_mu;
std::unordered_map<uint64_t, std::shared_ptr<const GraphOutputs>> graphs;

std::shared_ptr<const GraphOutputs> outputs_of(uint64_t g) {
  std::lock_guard<std::mutex> lock(graphs_mu);
  auto it = graphs.find(g);
  TORCH_CHECK(it != graphs.end(), "tpu graph_launch: graph ", g,
              " was not captured by this process or was destroyed");
  return it->second;
}

void capture_begin() {
  check(dfuse_graph_capture_begin(rt(), current_stream()), "graph capture begin");
}

void capture_abort() {
  check(dfuse_graph_capture_abort(rt(), current_stream()), "graph capture abort");
}

// Ends the capture; the graph's handle, or 0 when the runtime cannot replay it (the reason is
// in `why`) or an output is a view the launch could not rebuild (a byte view of a storage of
// another dtype, a storage whose handle is not its own dense layout): the caller then keeps
// running the graph op by op.
std::tuple<int64_t, std::string> capture_end(at::TensorList inputs, at::TensorList outputs) {
  auto complex = [](const at::Tensor& t) { return t.is_complex(); };
  if (std::any_of(inputs.begin(), inputs.end(), complex) ||
      std::any_of(outputs.begin(), outputs.end(), complex)) {
    // Held as float32 pairs (complex.cpp): the launch's handles would carry the pairs' dtype.
    capture_abort();
    return {0, "a graph input or output is complex64, which a launch does not rebuild"};
  }
  std::vector<Ref> in_refs;
  std::vector<uint64_t> in;
  in_refs.reserve(inputs.size());
  for (const auto& t : inputs) {
    in_refs.push_back(ref(t));
    in.push_back(in_refs.back().get());
  }
  auto spec = std::make_shared<GraphOutputs>();
  std::vector<uint64_t> bases;
  std::string refused;
  for (const auto& t : outputs) {
    const StorageCtx& c = storage_ctx(t);
    if (c.dtype != to_dtype(t.scalar_type()) ||
        !at::IntArrayRef(c.strides).equals(c10::contiguous_strides(c.sizes))) {
      refused = "an output views a storage in a layout a launch cannot rebuild";
      break;
    }
    size_t k = 0;
    while (k < bases.size() && bases[k] != c.handle) k++;
    if (k == bases.size()) bases.push_back(c.handle);
    bool whole = t.storage_offset() == 0 && t.sizes().equals(c.sizes) &&
                 t.strides().equals(c.strides);
    spec->views.push_back(
        {k, whole, t.sizes().vec(), t.strides().vec(), int64_t(t.storage_offset())});
  }
  spec->n_bases = bases.size();
  if (!refused.empty()) {
    capture_abort();
    return {0, refused};
  }
  uint64_t g = 0;
  DfuseStatus s = dfuse_graph_capture_end(rt(), current_stream(), in.data(), in.size(),
                                          bases.data(), bases.size(), &g);
  if (s == DFUSE_STATUS_NOT_CAPTURABLE) return {0, dfuse_last_error()};
  check(s, "graph capture end");
  std::lock_guard<std::mutex> lock(graphs_mu);
  graphs[g] = std::move(spec);
  return {int64_t(g), ""};
}

// A tensor of `base`'s storage with another geometry (no dispatch: the launch's outputs are
// made for every call, and a dispatched as_strided costs microseconds each).
at::Tensor view_of(const at::Tensor& base, const OutputView& v) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(base.storage()), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      base.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(v.sizes, v.strides, v.offset);
  return t;
}

// Runs graph `g` on `inputs`; inputs the capture would not take (another shape, layout, dtype
// or aliasing) raise ValueError, which the caller answers by running the graph op by op.
std::vector<at::Tensor> launch(int64_t g, at::TensorList inputs) {
  auto spec = outputs_of(uint64_t(g));
  std::vector<Ref> in_refs;
  std::vector<uint64_t> in;
  in_refs.reserve(inputs.size());
  in.reserve(inputs.size());
  for (const auto& t : inputs) {
    in_refs.push_back(ref(t));
    in.push_back(in_refs.back().get());
    note_storage_write(t);  // the graph may write its inputs in place
  }
  std::vector<uint64_t> outs(spec->n_bases);
  DfuseStatus s = dfuse_graph_launch(rt(), current_stream(), uint64_t(g), in.data(), in.size(),
                                     outs.data(), outs.size());
  TORCH_CHECK_VALUE(s != DFUSE_STATUS_INVALID_ARGUMENT, "deferfuse (graph launch): ",
                    dfuse_last_error());
  check(s, "graph launch");
  std::vector<at::Tensor> bases;
  bases.reserve(outs.size());
  for (uint64_t h : outs) bases.push_back(wrap(h));
  std::vector<at::Tensor> result;
  result.reserve(spec->views.size());
  for (const auto& v : spec->views) {
    result.push_back(v.whole ? bases[v.base] : view_of(bases[v.base], v));
  }
  return result;
}

// A CPU tensor's values as a new tpu tensor, copied now: the host values a split graph's
// device part reads at each launch (compile_backend.py). `.to("tpu")` would record a copy op
// that runs as a program of its own before every launch; this records nothing.
at::Tensor upload(const at::Tensor& host) {
  TORCH_CHECK(host.device().is_cpu(), "tpu graph_upload: expected a CPU tensor, given one on ",
              host.device());
  // complex64 travels as its float32 pairs (complex.cpp), seen as complex again on the device.
  if (host.scalar_type() == at::kComplexFloat) {
    return at::view_as_complex(upload(at::view_as_real(host.resolve_conj()).contiguous()));
  }
  auto c = host.contiguous();
  uint64_t h = 0;
  check(dfuse_tensor_from_host(rt(), c.data_ptr(), c.nbytes(), to_dtype(c.scalar_type()),
                               c.sizes().data(), c.dim(), &h),
        "graph upload");
  return wrap(h);
}

void destroy(int64_t g) {
  {
    std::lock_guard<std::mutex> lock(graphs_mu);
    graphs.erase(uint64_t(g));
  }
  check(dfuse_graph_destroy(rt(), uint64_t(g)), "graph destroy");
}

}  // namespace
}  // namespace dft

TORCH_LIBRARY_FRAGMENT(deferfuse, m) {
  m.def("graph_capture_begin() -> ()", &dft::capture_begin);
  m.def("graph_capture_abort() -> ()", &dft::capture_abort);
  m.def("graph_capture_end(Tensor[] inputs, Tensor[] outputs) -> (int, str)", &dft::capture_end);
  m.def("graph_launch(int graph, Tensor[] inputs) -> Tensor[]", &dft::launch);
  m.def("graph_destroy(int graph) -> ()", &dft::destroy);
  m.def("graph_upload(Tensor host) -> Tensor", &dft::upload);
}
