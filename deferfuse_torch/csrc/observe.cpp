// The source lines behind sync points and CPU fallbacks (see observe.h), kept in a log that
// deferfuse_torch.explain() reads, added to a running timeline trace as marks, and printed
// when DEFERFUSE_LOG is set; and the source line of each recorded op, named to the runtime,
// whose cut events (and, when DEFERFUSE_LOG prints cuts, cut lines) carry it.
#include "observe.h"

#include "common.h"

#include <Python.h>
#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace dft {
namespace {

// Whether to note anything: explain/trace turn it on; DEFERFUSE_LOG turns it on for the
// process (logging is already slow).
std::atomic<bool> g_on{false};
const bool g_log = std::getenv("DEFERFUSE_LOG") != nullptr;

std::mutex g_mu;
// Package directories whose frames are not the user's (torch, deferfuse_torch).
std::vector<std::string> g_skip;

struct Note {
  std::string kind;  // "sync" or "fallback"
  std::string what;  // "item", "copy to host", an op name
  std::string where; // "file.py:42 in fn", or why there is no frame
};
std::vector<Note> g_notes;
// Bounds the log of a long run; the counts in stats() stay exact.
constexpr size_t kMaxNotes = 1 << 16;
// Source lines of recorded ops, by the id the runtime's tag carries (from 1); emptied with
// the notes, each id noted as a "line" note when first given.
std::map<std::string, uint32_t> g_line_ids;

// This thread's halves of the runtime's tag (see observe.h).
thread_local uint32_t t_correlation = 0;
thread_local uint32_t t_line = 0;

void apply_tag() {
  check(dfuse_profiler_tag(rt(), (uint64_t(t_line) << 32) | t_correlation), "profiler tag");
}

bool skipped(const std::string& file, const std::vector<std::string>& skip) {
  if (file.rfind("<frozen", 0) == 0) return true;
  for (const auto& d : skip) {
    if (file.rfind(d, 0) == 0) return true;
  }
  return false;
}

// The first Python frame outside the `skip` directories, as "file:line in function". torch's
// bindings release the GIL before they dispatch, so it is taken here; a thread Python never
// knew (no thread state) has no frames to look at.
std::string user_line(const std::vector<std::string>& skip) {
  if (!Py_IsInitialized()) return "(no Python frame)";
  if (!PyGILState_Check() && PyGILState_GetThisThreadState() == nullptr) {
    return "(no Python frame: a thread outside Python, e.g. autograd backward)";
  }
  PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  // Autograd's backward thread has a thread state but no frames.
  std::string out = f ? "(no user frame)" : "(no Python frame: autograd backward)";
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    PyObject* file = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_filename");
    PyObject* name = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), "co_name");
    const char* fs = file ? PyUnicode_AsUTF8(file) : nullptr;
    const char* ns = name ? PyUnicode_AsUTF8(name) : nullptr;
    bool found = false;
    if (fs && !skipped(fs, skip)) {
      std::ostringstream os;
      os << fs << ':' << PyFrame_GetLineNumber(f) << " in " << (ns ? ns : "?");
      out = os.str();
      found = true;
    }
    Py_XDECREF(file);
    Py_XDECREF(name);
    Py_DECREF(code);
    PyFrameObject* back = found ? nullptr : PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  PyErr_Clear();
  PyGILState_Release(gil);
  return out;
}

void note(const char* kind, const char* what) {
  if (!g_on.load(std::memory_order_relaxed) && !g_log) return;
  std::vector<std::string> skip;
  {
    std::lock_guard<std::mutex> g(g_mu);
    skip = g_skip;
  }
  // Not under g_mu: taking the GIL while holding it could deadlock with a Python thread
  // that holds the GIL and waits for g_mu (observe_take).
  std::string where = user_line(skip);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (g_notes.size() < kMaxNotes) g_notes.push_back({kind, what, where});
  }
  if (g_log) std::fprintf(stderr, "deferfuse_torch: %s %s at %s\n", kind, what, where.c_str());
  uint32_t tracing = 0;
  if (dfuse_trace_active(rt(), &tracing) == DFUSE_STATUS_OK && tracing) {
    std::string name = std::string(kind) + ": " + what;
    dfuse_trace_mark(rt(), 0, name.c_str(), where.c_str());
  }
}

// Whether the runtime's log prints fusion cuts (DEFERFUSE_LOG at debug): then every op is
// tagged with its source line, as under explain, and each line is named to the runtime, which
// prints it after each cut line. Asked once.
bool log_cuts() {
  static const bool on = [] {
    uint32_t v = 0;
    return dfuse_log_cuts(rt(), &v) == DFUSE_STATUS_OK && v != 0;
  }();
  return on;
}

void note_op_line() {
  std::vector<std::string> skip;
  {
    std::lock_guard<std::mutex> g(g_mu);
    skip = g_skip;
  }
  // As in note(): the frames are read without holding g_mu.
  std::string where = user_line(skip);
  uint32_t id = 0;
  bool fresh = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto [it, added] = g_line_ids.emplace(where, uint32_t(g_line_ids.size() + 1));
    id = it->second;
    fresh = added;
    if (fresh && g_notes.size() < kMaxNotes) {
      g_notes.push_back({"line", std::to_string(id), where});
    }
  }
  // Named before any op carries it (a trace file's and the log's cuts name it); once per
  // line. observe_take restarts the ids, so a reused id is renamed.
  if (fresh) check(dfuse_source_name(rt(), id, where.c_str()), "source name");
  if (id != t_line) {
    t_line = id;
    apply_tag();
  }
}

// Turns noting on or off; `skip` is the package directories (one per line) whose frames are
// not the user's. Returns whether it was on.
bool observe_set(bool on, const std::string& skip) {
  bool was = false;
  {
    std::lock_guard<std::mutex> g(g_mu);
    g_skip.clear();
    std::istringstream is(skip);
    for (std::string line; std::getline(is, line);) {
      if (!line.empty()) g_skip.push_back(line);
    }
    was = g_on.exchange(on);
  }
  // Ops recorded after noting stops carry no source line (a DEFERFUSE_TRACE file's cuts would
  // otherwise name the last line explain saw on this thread).
  if (!on && t_line != 0) {
    t_line = 0;
    apply_tag();
  }
  return was;
}

// The notes since the last take, as "kind\twhat\twhere" lines; the log is emptied.
std::string observe_take() {
  std::lock_guard<std::mutex> g(g_mu);
  std::ostringstream os;
  for (const auto& n : g_notes) os << n.kind << '\t' << n.what << '\t' << n.where << '\n';
  g_notes.clear();
  g_line_ids.clear();
  return os.str();
}

// Starts or stops the runtime's timeline (an empty path stops it; returns "events dropped").
std::string trace_control(const std::string& path, int64_t max_events) {
  if (!path.empty()) {
    check(dfuse_trace_start(rt(), path.c_str(), uint64_t(max_events)), "trace start");
    return "";
  }
  uint64_t events = 0, dropped = 0;
  check(dfuse_trace_stop(rt(), &events, &dropped), "trace stop");
  return std::to_string(events) + " " + std::to_string(dropped);
}

}  // namespace

void note_sync(const char* what) { note("sync", what); }
void note_fallback(const char* name) { note("fallback", name); }

void note_op() {
  // explain and trace read cut lines, and so does the log when it prints cuts: a frame walk
  // per op then (a debugging mode). Otherwise one relaxed load and one bool.
  if (g_on.load(std::memory_order_relaxed) || (g_log && log_cuts())) note_op_line();
}

void set_correlation_tag(uint32_t id) {
  t_correlation = id;
  apply_tag();
}

}  // namespace dft

TORCH_LIBRARY_FRAGMENT(deferfuse, m) {
  m.def("observe_set(bool on, str skip) -> bool", &dft::observe_set);
  m.def("observe_take() -> str", &dft::observe_take);
  m.def("trace_control(str path, int max_events) -> str", &dft::trace_control);
}
