// The boxed CPU fallback for every op without a tpu kernel, counting each op by name so a user
// (and the tests) can see exactly what did not run on deferfuse.
//
// An out= or in-place overload whose functional overload has a tpu kernel runs on the device
// instead (out_variants.cpp) and is not counted.
//
// at::native::cpu_fallback copies tensor arguments to the host, runs the CPU kernel and writes
// back every argument the schema marks mutable (Tensor(a!), Tensor(a!)[], out=). Two cases
// need more, and are handled around it here:
// - ops that write arguments their schema does not mark (batch norm's running statistics):
//   those arguments travel as host copies we write back ourselves;
// - out= arguments: the CPU kernel gets a zero-element out of the same dtype instead of a
//   downloaded copy of the old contents (which it never reads), and the result is resized into
//   the user's out with resize_output, as PyTorch does. Handing the CPU kernel the device's out
//   made composite functional ops (smooth_l1_loss: its meta shapes the out to [] before the
//   out= kernel runs) warn that "an output with one or more elements was resized".
#include "common.h"
#include "observe.h"

#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

namespace dft {
namespace {

std::mutex g_mu;
std::map<std::string, int64_t> g_counts;

// An op (every overload) that writes `args` although its schema does not say so; when
// `only_if` names a bool argument, only while that argument is true.
struct HiddenWrite {
  const char* op;
  std::vector<const char*> args;
  const char* only_if;
};

const HiddenWrite kHiddenWrites[] = {
    {"aten::native_batch_norm", {"running_mean", "running_var"}, "training"},
    {"aten::batch_norm_update_stats", {"running_mean", "running_var"}, nullptr},
};

bool is_tpu_tensor(const c10::IValue& v) {
  return v.isTensor() && v.toTensor().defined() &&
         v.toTensor().device().type() == c10::DeviceType::PrivateUse1;
}

// Index of the argument named `name` in the schema, or -1.
int arg_index(const c10::FunctionSchema& s, const char* name) {
  const auto& args = s.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == name) return static_cast<int>(i);
  }
  return -1;
}

// A device tensor and the stand-in the CPU kernel got for it.
struct Swap {
  at::Tensor device;
  at::Tensor stand_in;
};

// Puts host copies of the unannotated written arguments on the stack.
std::vector<Swap> swap_hidden_writes(const c10::FunctionSchema& s, torch::jit::Stack* stack,
                                     size_t begin) {
  std::vector<Swap> out;
  for (const auto& hw : kHiddenWrites) {
    if (s.name() != hw.op) continue;
    if (hw.only_if) {
      int g = arg_index(s, hw.only_if);
      if (g >= 0 && (*stack)[begin + g].isBool() && !(*stack)[begin + g].toBool()) continue;
    }
    for (const char* a : hw.args) {
      int i = arg_index(s, a);
      if (i < 0 || !is_tpu_tensor((*stack)[begin + i])) continue;
      at::Tensor dev = (*stack)[begin + i].toTensor();
      at::Tensor host = dev.to(at::kCPU);
      (*stack)[begin + i] = host;
      out.push_back({dev, host});
    }
  }
  return out;
}

// Replaces non-empty device out= arguments by empty device tensors of their dtype.
std::vector<Swap> swap_outs(const c10::FunctionSchema& s, torch::jit::Stack* stack,
                            size_t begin) {
  std::vector<Swap> out;
  const auto& args = s.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].is_out() || !is_tpu_tensor((*stack)[begin + i])) continue;
    at::Tensor dev = (*stack)[begin + i].toTensor();
    if (dev.numel() == 0) continue;
    at::Tensor empty = at::empty({0}, dev.options());
    (*stack)[begin + i] = empty;
    out.push_back({dev, empty});
  }
  return out;
}

// An out= argument on another device than the tpu inputs raises as CUDA's kernels do (the CPU
// fallback would fail copying the result into it with a dispatcher error).
void check_out_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  size_t begin = stack.size() - args.size();
  const c10::IValue* tpu = nullptr;
  for (size_t i = 0; i < args.size() && tpu == nullptr; ++i) {
    if (!args[i].is_out() && is_tpu_tensor(stack[begin + i])) tpu = &stack[begin + i];
  }
  if (tpu == nullptr) return;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& v = stack[begin + i];
    if (!args[i].is_out() || !v.isTensor() || !v.toTensor().defined() || is_tpu_tensor(v)) {
      continue;
    }
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two ",
                "devices, ", tpu->toTensor().device(), " and ", v.toTensor().device(),
                "! (when checking argument ", args[i].name(), " of ", op.schema().name(), ".",
                op.schema().overload_name(), ")");
  }
}

// The native convolution kernels PyTorch picks by the input's device (its slow, depthwise and
// oneDNN ones). Only an input left on the CPU with a tpu weight or bias reaches them here (tpu
// inputs take the device's own convolution): on CUDA their kernels refuse the mix, and the
// fallback would quietly compute on the CPU, the result left there and its backward failing.
const char* const kDeviceConvolutions[] = {
    "aten::_slow_conv2d_forward", "aten::_slow_conv2d_backward", "aten::thnn_conv2d",
    "aten::slow_conv3d_forward",  "aten::slow_conv3d",           "aten::slow_conv_dilated2d",
    "aten::slow_conv_dilated3d",  "aten::slow_conv_transpose2d", "aten::slow_conv_transpose3d",
    "aten::_conv_depthwise2d",    "aten::conv_depthwise3d",      "aten::mkldnn_convolution",
    "aten::_nnpack_spatial_convolution",
};

// Raises PyTorch's convolution type check (check_input_same_type_as_parameters) when a
// native convolution kernel got an input on another device than its tpu weight or bias.
void check_convolution_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& s = op.schema();
  bool conv = false;
  for (const char* name : kDeviceConvolutions) conv = conv || s.name() == name;
  if (!conv) return;
  size_t begin = stack.size() - s.arguments().size();
  auto arg = [&](const char* name) {
    int i = arg_index(s, name);
    const c10::IValue* v = i < 0 ? nullptr : &stack[begin + i];
    return v != nullptr && v->isTensor() && v->toTensor().defined() ? v->toTensor()
                                                                     : at::Tensor();
  };
  at::Tensor input = arg("self").defined() ? arg("self") : arg("input");
  if (!input.defined() || input.device().type() == c10::DeviceType::PrivateUse1) return;
  for (const char* name : {"weight", "bias"}) {
    at::Tensor p = arg(name);
    TORCH_CHECK(!p.defined() || p.device() == input.device(), "Input type (", input.toString(),
                ") and ", name, " type (", p.toString(), ") should be the same");
  }
}

// Counts the op (every overload by its full name) and notes it for explain() and the logs;
// returns the name.
std::string note_and_count(const c10::FunctionSchema& schema) {
  const auto& n = schema.operator_name();
  std::string name = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
  count_fallback(name);
  note_fallback(name.c_str());
  return name;
}

void counting_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  check_out_devices(op, *stack);
  check_convolution_devices(op, *stack);
  if (run_through_functional(op, stack)) return;
  const auto& schema = op.schema();
  note_and_count(schema);
  size_t begin = stack->size() - schema.arguments().size();
  auto hidden = swap_hidden_writes(schema, stack, begin);
  auto outs = swap_outs(schema, stack, begin);
  at::native::cpu_fallback(op, stack);
  for (auto& h : hidden) h.device.copy_(h.stand_in);
  if (outs.empty()) return;
  size_t rbegin = stack->size() - schema.returns().size();
  for (auto& o : outs) {
    at::native::resize_output(o.device, o.stand_in.sizes());
    o.device.copy_(o.stand_in);
    for (size_t r = rbegin; r < stack->size(); ++r) {
      if ((*stack)[r].isTensor() && (*stack)[r].toTensor().is_same(o.stand_in)) {
        (*stack)[r] = o.device;
      }
    }
  }
}

// The fallback for nested tensors. PyTorch's cpu_fallback reads dense sizes, which a nested
// tensor does not have, so this one moves each tpu argument to the CPU (a nested one through
// its buffer), runs the op's CPU kernel, copies the arguments it wrote back into the tpu
// originals and moves tensor results to the tpu.
void counting_nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& s = op.schema();
  std::string name = note_and_count(s);
  size_t begin = stack->size() - s.arguments().size();
  std::optional<c10::Device> device;
  std::vector<Swap> written;
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    auto& v = (*stack)[begin + i];
    if (!is_tpu_tensor(v)) {
      TORCH_CHECK(!v.isTensorList() && !v.isOptionalTensorList(), "tpu: ", name,
                  " on nested tensors has no tpu kernel, and the CPU fallback for nested "
                  "tensors takes no tensor lists; pad them first (t.to_padded_tensor(0.0))");
      continue;
    }
    at::Tensor t = v.toTensor();
    device = t.device();
    at::Tensor host = t.to(at::kCPU);
    const auto& alias = s.arguments()[i].alias_info();
    if (alias && alias->isWrite()) written.push_back({t, host});
    v = host;
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
  for (auto& w : written) w.device.copy_(w.stand_in);
  if (!device) return;
  for (size_t i = stack->size() - s.returns().size(); i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    at::Tensor r = v.toTensor();
    for (auto& w : written) {
      if (r.is_same(w.stand_in)) r = w.device;  // an in-place op returns its tpu self
    }
    v = r.device().type() == c10::DeviceType::PrivateUse1 ? r : r.to(*device);
  }
}

}  // namespace

void count_fallback(const std::string& name) {
  std::lock_guard<std::mutex> g(g_mu);
  ++g_counts[name];
}

// "name count" lines, sorted by name.
std::string fallback_counts_text() {
  std::lock_guard<std::mutex> g(g_mu);
  std::ostringstream os;
  for (const auto& [k, v] : g_counts) os << k << ' ' << v << '\n';
  return os.str();
}

void reset_fallback_counts() {
  std::lock_guard<std::mutex> g(g_mu);
  g_counts.clear();
}

}  // namespace dft

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&dft::counting_fallback>());
}

// Nested tensors on tpu (nn.TransformerEncoder's eval fast path makes one from a padding mask):
// an op without a nested tpu kernel (nested.cpp) runs on CPU's nested kernels the same way.
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&dft::counting_nested_fallback>());
}
