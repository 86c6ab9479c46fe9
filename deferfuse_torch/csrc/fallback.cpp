// The boxed CPU fallback for every op without a tpu kernel, counting each op by name so a user
// (and the tests) can see exactly what did not run on deferfuse.
#include "common.h"

#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <sstream>

namespace dft {
namespace {

std::mutex g_mu;
std::map<std::string, int64_t> g_counts;

void counting_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& n = op.schema().operator_name();
  count_fallback(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
  at::native::cpu_fallback(op, stack);
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
