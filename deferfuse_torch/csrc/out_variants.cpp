// out= and in-place overloads without a tpu kernel of their own run on the device through
// their functional overload's tpu kernel: `torch.mm(a, b, out=c)` is `c.copy_(mm(a, b))`.
//
// PyTorch registers a backend's kernel per overload, and this extension registers most ops'
// functional overloads only. Their out= siblings (mm.out, cat.out, sigmoid.out, max.dim_max)
// and the in-place ops that PyTorch composes from them (x.eq_(y) is eq.Tensor_out with out=x,
// baddbmm_ is baddbmm.out) went to the CPU fallback: two host round trips and, in defer mode,
// a sync point per call (`mm(out=)` on [512, 32] @ [32, 4608]: 5.4 ms against 1.6 for `mm`).
//
// The sibling is found by schema, not by name: the overload of the same op whose arguments are
// the out= overload's arguments without its outs (or, for `op_`, the overload `op` of the same
// overload name with the same arguments), that returns one tensor per out and none aliased (a
// view op's in-place form, as_strided_, changes metadata, not values), and that has a tpu
// kernel of its own (so the functional never comes back here through a composite).
//
// Where PyTorch's own out= kernel would say more than "resize and copy", the call takes the
// CPU fallback as before, so its results and errors stay PyTorch's own:
// - an argument not on tpu (the fallback's rules for mixed devices);
// - an out= of another dtype than the result (mm.out raises there; TensorIterator ops cast),
//   unless the out is exactly an input (the in-place form); in place, a result that cannot be
//   cast into self (add_ of a float into an int tensor raises);
// - an out that partly overlaps an input or itself (PyTorch raises "unsupported operation"),
//   where an out that is exactly an input (x.eq_(y)) is fine: the result is computed first.
#include "common.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>

#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace dft {
namespace {

// Ops whose functional overload writes an argument its schema does not mark.
bool writes_unmarked(const std::string& name) {
  return name == "aten::_copy_from" || name == "aten::_copy_from_and_resize";
}

bool same_arguments(const std::vector<c10::Argument>& a, const std::vector<c10::Argument>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name() != b[i].name() || a[i].type()->str() != b[i].type()->str()) return false;
  }
  return true;
}

// Whether `f` can stand in for an overload with arguments `args` writing `outs` results.
bool is_functional_sibling(const c10::OperatorHandle& f, const std::vector<c10::Argument>& args,
                           size_t outs) {
  const auto& s = f.schema();
  if (s.is_mutable() || s.returns().size() != outs || writes_unmarked(s.name())) return false;
  for (const auto& r : s.returns()) {
    if (r.alias_info() != nullptr || r.type()->kind() != c10::TypeKind::TensorType) return false;
  }
  return same_arguments(s.arguments(), args) &&
         f.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1);
}

// Every registered overload name of each op, listed once.
const std::map<std::string, std::vector<std::string>>& overloads() {
  static const auto* all = [] {
    auto* m = new std::map<std::string, std::vector<std::string>>();
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
      (*m)[n.name].push_back(n.overload_name);
    }
    return m;
  }();
  return *all;
}

// The functional sibling of `op` (see the file comment), if any.
std::optional<c10::OperatorHandle> find_sibling(const c10::OperatorHandle& op) {
  const auto& s = op.schema();
  std::vector<c10::Argument> args;
  size_t outs = 0;
  for (const auto& a : s.arguments()) {
    if (a.is_out()) {
      ++outs;
    } else {
      args.push_back(a);
    }
  }
  auto& d = c10::Dispatcher::singleton();
  if (outs > 0) {
    auto it = overloads().find(s.name());
    if (it == overloads().end()) return std::nullopt;
    for (const auto& o : it->second) {
      auto f = d.findOp({s.name(), o});
      if (f && is_functional_sibling(*f, args, outs)) return f;
    }
    return std::nullopt;
  }
  // op_: the first argument is self, written in place.
  const auto& name = s.name();
  const auto* self = s.arguments().empty() ? nullptr : s.arguments()[0].alias_info();
  if (name.size() < 2 || name.back() != '_' || self == nullptr || !self->isWrite() ||
      s.returns().size() != 1) {
    return std::nullopt;
  }
  auto f = d.findOp({name.substr(0, name.size() - 1), s.overload_name()});
  if (f && is_functional_sibling(*f, s.arguments(), 1)) return f;
  return std::nullopt;
}

// find_sibling, once per op.
std::optional<c10::OperatorHandle> sibling(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static std::unordered_map<c10::OperatorName, std::optional<c10::OperatorHandle>> memo;
  std::lock_guard<std::mutex> g(mu);
  auto it = memo.find(op.operator_name());
  if (it == memo.end()) it = memo.emplace(op.operator_name(), find_sibling(op)).first;
  return it->second;
}

bool on_device(const at::Tensor& t) {
  return !t.defined() || t.device().type() == c10::DeviceType::PrivateUse1;
}

bool all_on_device(const c10::IValue& v) {
  if (v.isTensor()) return on_device(v.toTensor());
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (!on_device(t)) return false;
    }
  }
  if (v.isOptionalTensorList()) {
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      if (t && !on_device(*t)) return false;
    }
  }
  return true;
}

// How `target` (an out, or self in place) overlaps the tensor `inputs`.
enum class Overlap { None, Exact, Partial };

Overlap overlap_with(const at::Tensor& target, const std::vector<c10::IValue>& inputs) {
  if (at::has_internal_overlap(target) != at::MemOverlap::No) return Overlap::Partial;
  auto found = Overlap::None;
  for (const auto& v : inputs) {
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    // Another storage cannot overlap. Tested first: PyTorch's status is "too hard" for any
    // input that is not dense (`mm(a[:, :3], b, out=c)`), which would send the call to the
    // CPU fallback.
    if (!target.storage().is_alias_of(v.toTensor().storage())) continue;
    auto st = at::get_overlap_status(target, v.toTensor());
    if (st == at::MemOverlapStatus::Full) {
      found = Overlap::Exact;
    } else if (st != at::MemOverlapStatus::No) {
      return Overlap::Partial;
    }
  }
  return found;
}

}  // namespace

bool run_through_functional(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  auto f = sibling(op);
  if (!f) return false;
  const auto& s = op.schema();
  size_t n = s.arguments().size(), begin = stack->size() - n;
  std::vector<c10::IValue> inputs;
  std::vector<at::Tensor> targets;  // the outs, or self
  for (size_t i = 0; i < n; ++i) {
    const auto& v = (*stack)[begin + i];
    if (!all_on_device(v)) return false;
    if (!s.arguments()[i].is_out()) {
      inputs.push_back(v);
    } else if (v.isTensor() && v.toTensor().defined()) {
      targets.push_back(v.toTensor());
    } else {
      return false;
    }
  }
  bool in_place = targets.empty();
  if (in_place) {
    if (!inputs[0].isTensor()) return false;
    targets.push_back(inputs[0].toTensor());
  }
  std::vector<c10::IValue> read(inputs.begin() + (in_place ? 1 : 0), inputs.end());
  // Per target, whether it may take a result of another dtype by a cast: self in place, and
  // an out that is exactly an input (PyTorch composes x.eq_(y) as eq.Tensor_out(x, y, out=x)).
  std::vector<bool> casts;
  for (const auto& t : targets) {
    auto o = overlap_with(t, read);
    if (o == Overlap::Partial) return false;
    casts.push_back(in_place || o == Overlap::Exact);
  }
  // In strict mode the op and its copy are one program, as PyTorch's out= kernel is one op.
  OpGroup group;
  bool ran = [&] {
    torch::jit::Stack call(inputs.begin(), inputs.end());
    f->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &call);
    for (size_t i = 0; i < targets.size(); ++i) {
      auto r = call[i].toTensor().scalar_type(), t = targets[i].scalar_type();
      // Nothing is written yet: the CPU fallback runs the op again and gives PyTorch's own
      // answer or error.
      if (casts[i] ? !at::canCast(r, t) : r != t) return false;
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      const at::Tensor& r = call[i].toTensor();
      // As PyTorch's out= kernels: resized (with its warning when the out held elements), and
      // then laid out as the result where that is dense.
      if (!in_place && at::native::resize_output(targets[i], r.sizes()) &&
          r.is_non_overlapping_and_dense() && !r.is_contiguous()) {
        targets[i].as_strided_(r.sizes(), r.strides());
      }
      targets[i].copy_(r);
    }
    return true;
  }();
  group.end();
  if (!ran) return false;
  stack->erase(stack->begin() + begin, stack->end());
  for (const auto& t : targets) stack->push_back(t);
  return true;
}

}  // namespace dft
