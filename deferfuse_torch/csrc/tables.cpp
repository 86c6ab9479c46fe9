// Device copies of host-built constant tables, kept by content (see tables.h).
#include "tables.h"

#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

namespace dft {
namespace {

// Bounds: tables past kMaxTableBytes are uploaded every time (a geometry that large is rare and
// its op costs far more than the upload), and at most kMaxTables are kept, least recently used
// first out, so a model that resizes to ever-new shapes holds a few MB at most.
constexpr size_t kMaxTableBytes = size_t(256) << 10;
constexpr size_t kMaxTables = 64;

class TableCache {
 public:
  // The kept tensor for `key`, or an undefined one.
  at::Tensor find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return at::Tensor();
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  void put(std::string key, const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.count(key)) return;
    order_.emplace_front(std::move(key), t);
    index_.emplace(order_.front().first, order_.begin());
    while (order_.size() > kMaxTables) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  // The tensors are released after the lock is let go (releasing calls into the runtime).
  void clear() {
    std::list<std::pair<std::string, at::Tensor>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      index_.clear();
      dropped.swap(order_);
    }
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, at::Tensor>> order_;
  std::unordered_map<std::string, std::list<std::pair<std::string, at::Tensor>>::iterator> index_;
};

// Never destroyed: at exit the runtime may be gone before static destructors run, and
// releasing a kept tensor then would call into it.
TableCache& cache() {
  static TableCache* c = new TableCache();
  return *c;
}

// dtype, rank, sizes and the values' bytes: equal keys are equal tables.
template <typename T>
std::string key_of(const std::vector<T>& values, at::IntArrayRef sizes, at::ScalarType dtype,
                   char kind) {
  std::string k;
  k.reserve(2 + (1 + sizes.size()) * 8 + values.size() * sizeof(T));
  k.push_back(kind);
  k.push_back(static_cast<char>(dtype));
  int64_t rank = int64_t(sizes.size());
  k.append(reinterpret_cast<const char*>(&rank), sizeof rank);
  k.append(reinterpret_cast<const char*>(sizes.data()), sizes.size() * sizeof(int64_t));
  k.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return k;
}

template <typename T>
at::Tensor kept_upload(const std::vector<T>& values, at::IntArrayRef sizes, at::ScalarType dtype,
                       at::ScalarType host_dtype, char kind) {
  auto upload = [&] {
    // A normal tensor even when first asked for under torch.inference_mode(): a kept table
    // outlives that block, and autograd refuses to save an inference tensor later.
    c10::InferenceMode normal(false);
    auto host = at::tensor(values, host_dtype).view(sizes).to(dtype);
    return host.to(c10::Device(c10::DeviceType::PrivateUse1, 0));
  };
  if (values.size() * sizeof(T) > kMaxTableBytes) return upload();
  auto key = key_of(values, sizes, dtype, kind);
  if (auto t = cache().find(key); t.defined()) return t;
  auto t = upload();
  cache().put(std::move(key), t);
  return t;
}

}  // namespace

at::Tensor upload_table(const std::vector<double>& values, at::IntArrayRef sizes,
                        at::ScalarType dtype) {
  return kept_upload(values, sizes, dtype, at::kDouble, 'd');
}

at::Tensor upload_table(const std::vector<int64_t>& values, at::IntArrayRef sizes) {
  return kept_upload(values, sizes, at::kLong, at::kLong, 'i');
}

at::Tensor table_axis(const at::Tensor& like, int64_t n, int64_t axis, int64_t rank) {
  std::vector<int64_t> shape(rank, 1);
  shape[axis] = n;
  return at::arange(n, like.options().dtype(at::kLong)).view(shape);
}

void clear_uploaded_tables() { cache().clear(); }

}  // namespace dft
