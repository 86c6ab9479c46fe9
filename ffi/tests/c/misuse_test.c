/*
 * Misuse of every deferfuse C entry point, as a careless or buggy PyTorch backend would commit
 * it: NULL and misaligned pointers, stale, double-released, foreign and wrong-kind handles,
 * bad dtypes, shapes, byte lengths and enum numbers, element counts that overflow, bad
 * environment values, allocations that cannot succeed, and calls after dfuse_runtime_destroy.
 *
 * Each case must return its documented status AND leave a message that starts with the name of
 * the function that failed; none may crash (ffi/tests/misuse.rs also runs this program under
 * valgrind). After every group the runtime must still compute correctly.
 *
 * Prints one line per failed case, then "misuse cases: N passed, M failed"; exits nonzero on
 * any failure. Run by ffi/tests/misuse.rs.
 */
#define _POSIX_C_SOURCE 200809L
#include "deferfuse.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed = 0;
static int failed = 0;

/* The function a call expression names: "dfuse_x(a, b)" -> "dfuse_x". */
static size_t callee_len(const char *call) {
    const char *p = strchr(call, '(');
    return p ? (size_t)(p - call) : strlen(call);
}

/* One misuse case: `got` must be `want`, and the last error must name the callee. */
static void misuse(DfuseStatus got, DfuseStatus want, const char *call, int line) {
    const char *msg = dfuse_last_error();
    size_t n = callee_len(call);
    int named = msg != NULL && strncmp(msg, call, n) == 0 && msg[n] == ':' && strlen(msg) > n + 2;
    if (got == want && named) {
        passed++;
    } else {
        failed++;
        printf("FAIL line %d: %s: got status %d, want %d; last error \"%s\"\n", line, call,
               (int)got, (int)want, msg ? msg : "(NULL)");
    }
}
#define MISUSE(want, call) misuse((call), (want), #call, __LINE__)

static void check(int ok, const char *what, int line) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL line %d: %s (last error \"%s\")\n", line, what, dfuse_last_error());
    }
}
#define CHECK(cond) check((cond), #cond, __LINE__)
#define OK(call) check((call) == DFUSE_STATUS_OK, #call, __LINE__)

enum { INVALID_ARGUMENT = DFUSE_STATUS_INVALID_ARGUMENT, INVALID_HANDLE = DFUSE_STATUS_INVALID_HANDLE,
       BAD_OP = DFUSE_STATUS_BAD_OP, OOM = DFUSE_STATUS_OUT_OF_MEMORY, CONFIG = DFUSE_STATUS_CONFIG };

static DfuseOperand T(uint64_t h) {
    DfuseOperand o = {DFUSE_OPERAND_KIND_TENSOR, h, 0.0, 0};
    return o;
}
static DfuseOperand F(double f) {
    DfuseOperand o = {DFUSE_OPERAND_KIND_FLOAT, 0, f, 0};
    return o;
}
static DfuseAttrs attrs(uint32_t sub_op) {
    DfuseAttrs a;
    memset(&a, 0, sizeof a);
    a.sub_op = sub_op;
    return a;
}

static DfuseRuntime *make_runtime(uint32_t mode) {
    DfuseConfig cfg;
    DfuseRuntime *rt = NULL;
    OK(dfuse_config_default(&cfg));
    cfg.mode = mode;
    OK(dfuse_runtime_create(&cfg, &rt));
    return rt;
}

static const int64_t S23[2] = {2, 3};
static const float V6[6] = {1, 2, 3, 4, 5, 6};

static uint64_t f32_2x3(DfuseRuntime *rt) {
    uint64_t t = 0;
    OK(dfuse_tensor_from_host(rt, V6, sizeof V6, DFUSE_DTYPE_F32, S23, 2, &t));
    return t;
}

/* The runtime still works: (x * 2)[1][2] == 12, read back through a sync point. */
static void still_usable(DfuseRuntime *rt, int line) {
    uint64_t x = f32_2x3(rt), y = 0;
    DfuseAttrs mul = attrs(DFUSE_BINARY_OP_MUL);
    DfuseOperand in[2] = {T(x), F(2.0)};
    float out[6] = {0};
    int ok = dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &mul, in, 2, 0, &y) == DFUSE_STATUS_OK &&
             dfuse_tensor_to_host(rt, y, out, sizeof out) == DFUSE_STATUS_OK && out[5] == 12.0f;
    check(ok, "the runtime still computes correctly", line);
    dfuse_tensor_release(rt, y);
    dfuse_tensor_release(rt, x);
}

/*
 * Every entry point that takes a runtime, called with `rt` and otherwise plausible arguments:
 * each must fail with `want` (a NULL, bogus or destroyed runtime pointer).
 */
static void every_call_rejects_runtime(DfuseRuntime *rt, DfuseStatus want, uint64_t t,
                                       uint64_t s, uint64_t e) {
    uint64_t h = 0;
    uint32_t u = 0;
    size_t n = 0;
    int64_t dims[4];
    float buf[6];
    bool done = false;
    DfuseStats stats;
    DfuseScalar sc = {DFUSE_SCALAR_KIND_FLOAT, 1.0, 0};
    DfuseAttrs add = attrs(DFUSE_BINARY_OP_ADD);
    DfuseOperand in[2] = {T(t), T(t)};
    const int64_t targs[2] = {0, 1};
    const int64_t st[2] = {3, 1};
    MISUSE(want, dfuse_op(rt, s, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h));
    CHECK(h == 0);
    MISUSE(want, dfuse_op_meta(rt, s, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h, &u, dims, 4, &n));
    CHECK(h == 0);
    MISUSE(want, dfuse_runtime_destroy(rt));
    MISUSE(want, dfuse_mode_get(rt, &u));
    MISUSE(want, dfuse_mode_set(rt, DFUSE_MODE_STRICT));
    MISUSE(want, dfuse_mode_push(rt, DFUSE_MODE_STRICT));
    MISUSE(want, dfuse_mode_pop(rt));
    MISUSE(want, dfuse_pipeline_ops_set(rt, 8, &h));
    MISUSE(want, dfuse_op_group_begin(rt));
    MISUSE(want, dfuse_op_group_end(rt, 0));
    MISUSE(want, dfuse_release_cached_memory(rt, &h));
    MISUSE(want, dfuse_stats(rt, &stats));
    MISUSE(want, dfuse_stream_create(rt, &h));
    MISUSE(want, dfuse_stream_destroy(rt, s));
    MISUSE(want, dfuse_stream_synchronize(rt, s));
    MISUSE(want, dfuse_device_synchronize(rt));
    MISUSE(want, dfuse_event_create(rt, &h));
    MISUSE(want, dfuse_event_destroy(rt, e));
    MISUSE(want, dfuse_event_record(rt, e, s));
    MISUSE(want, dfuse_event_wait(rt, s, e));
    MISUSE(want, dfuse_event_query(rt, e, &done));
    MISUSE(want, dfuse_event_synchronize(rt, e));
    MISUSE(want, dfuse_tensor_from_host(rt, V6, sizeof V6, DFUSE_DTYPE_F32, S23, 2, &h));
    MISUSE(want, dfuse_tensor_empty(rt, DFUSE_DTYPE_F32, S23, 2, &h));
    MISUSE(want, dfuse_tensor_full(rt, s, S23, 2, sc, DFUSE_DTYPE_F32, &h));
    MISUSE(want, dfuse_tensor_to_host(rt, t, buf, sizeof buf));
    MISUSE(want, dfuse_tensor_item(rt, t, &sc));
    MISUSE(want, dfuse_tensor_ndim(rt, t, &n));
    MISUSE(want, dfuse_tensor_shape(rt, t, dims, 4));
    MISUSE(want, dfuse_tensor_meta(rt, t, &u, dims, 4, &n));
    MISUSE(want, dfuse_tensor_strides(rt, t, dims, 4));
    MISUSE(want, dfuse_tensor_dtype(rt, t, &u));
    MISUSE(want, dfuse_tensor_state(rt, t, &u));
    MISUSE(want, dfuse_tensor_retain(rt, t));
    MISUSE(want, dfuse_tensor_release(rt, t));
    MISUSE(want, dfuse_view(rt, s, DFUSE_VIEW_KIND_TRANSPOSE, t, targs, 2, &h));
    MISUSE(want, dfuse_as_strided(rt, t, S23, st, 2, 0, &h));
    CHECK(h == 0);
    MISUSE(want, dfuse_pending_dump(rt, s, NULL, 0, &n));
    uint64_t ev = 0, dr = 0;
    MISUSE(want, dfuse_trace_start(rt, "/tmp/dfuse-misuse-trace.json", 0));
    MISUSE(want, dfuse_trace_stop(rt, &ev, &dr));
    MISUSE(want, dfuse_trace_active(rt, &u));
    MISUSE(want, dfuse_trace_mark(rt, s, "mark", "detail"));
    MISUSE(want, dfuse_profiler_enable(rt, 1));
    MISUSE(want, dfuse_profiler_point(rt, &ev));
    DfuseProfiledRun runs[2];
    MISUSE(want, dfuse_profiler_capture(rt, 16, &dr));
    MISUSE(want, dfuse_profiler_tag(rt, 7));
    MISUSE(want, dfuse_log_cuts(rt, &u));
    MISUSE(want, dfuse_source_name(rt, 1, "train.py:3 in step"));
    MISUSE(want, dfuse_profiler_take(rt, runs, 2, &ev));
    double ms = 0;
    DfuseMemoryInfo mem;
    MISUSE(want, dfuse_event_create_timing(rt, &h));
    MISUSE(want, dfuse_event_elapsed_ms(rt, e, e, &ms));
    MISUSE(want, dfuse_stream_query(rt, s, &done));
    MISUSE(want, dfuse_tensor_to_host_for_size(rt, t, buf, sizeof buf));
    MISUSE(want, dfuse_memory_info(rt, &mem));
    MISUSE(want, dfuse_memory_limit_set(rt, 0));
    MISUSE(want, dfuse_memory_peak_reset(rt));
    uint64_t g = 0;
    MISUSE(want, dfuse_graph_capture_begin(rt, s));
    MISUSE(want, dfuse_graph_capture_end(rt, s, &t, 1, &t, 1, &g));
    MISUSE(want, dfuse_graph_capture_abort(rt, s));
    MISUSE(want, dfuse_graph_arity(rt, g, &n, &n));
    MISUSE(want, dfuse_graph_launch(rt, s, g, &t, 1, &h, 1));
    MISUSE(want, dfuse_graph_destroy(rt, g));
}

static void bad_runtime_pointers(void) {
    printf("-- NULL, bogus and destroyed runtime pointers\n");
    every_call_rejects_runtime(NULL, INVALID_ARGUMENT, 1, 0, 1);
    /* Aligned garbage, and a pointer to real memory that is not a runtime. */
    every_call_rejects_runtime((DfuseRuntime *)(uintptr_t)0x10000, INVALID_HANDLE, 1, 0, 1);
    uint64_t not_a_runtime[4] = {0, 0, 0, 0};
    every_call_rejects_runtime((DfuseRuntime *)not_a_runtime, INVALID_HANDLE, 1, 0, 1);
    /* A destroyed runtime with live-looking handles, streams and events. */
    DfuseRuntime *rt = make_runtime(DFUSE_MODE_DEFER);
    uint64_t t = f32_2x3(rt), s = 0, e = 0;
    OK(dfuse_stream_create(rt, &s));
    OK(dfuse_event_create(rt, &e));
    OK(dfuse_runtime_destroy(rt));
    every_call_rejects_runtime(rt, INVALID_HANDLE, t, s, e);
    MISUSE(INVALID_ARGUMENT, dfuse_runtime_create(NULL, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_config_default(NULL));
    CHECK(dfuse_version() != NULL && strlen(dfuse_version()) > 0);
}

static void null_and_misaligned_pointers(DfuseRuntime *rt) {
    printf("-- NULL and misaligned out-parameters and arrays\n");
    uint64_t t = f32_2x3(rt), h = 99;
    DfuseScalar sc = {DFUSE_SCALAR_KIND_FLOAT, 1.0, 0};
    DfuseAttrs add = attrs(DFUSE_BINARY_OP_ADD);
    DfuseOperand in[2] = {T(t), T(t)};
    const int64_t targs[2] = {0, 1}, st[2] = {3, 1};
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, NULL, 2, 0, &h));
    CHECK(h == 0);
    {
        uint32_t od = 0;
        size_t on = 0;
        int64_t osizes[4];
        MISUSE(INVALID_ARGUMENT,
               dfuse_op_meta(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, NULL, &od, osizes, 4, &on));
        MISUSE(INVALID_ARGUMENT,
               dfuse_op_meta(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h, NULL, osizes, 4, &on));
        CHECK(h == 0);
        MISUSE(INVALID_ARGUMENT,
               dfuse_op_meta(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h, &od, osizes, 4, NULL));
        CHECK(h == 0);
        MISUSE(INVALID_ARGUMENT,
               dfuse_op_meta(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h, &od, NULL, 2, &on));
        CHECK(h == 0);
    }
    MISUSE(INVALID_ARGUMENT, dfuse_mode_get(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_pipeline_ops_set(rt, 8, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_release_cached_memory(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_stats(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_stream_create(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_event_create(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_event_query(rt, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_event_create_timing(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_event_elapsed_ms(rt, 0, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_stream_query(rt, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_memory_info(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, 0, S23, 2, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, NULL, sizeof V6, 0, S23, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, 0, NULL, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, S23, 2, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, NULL, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_full(rt, 0, S23, 2, sc, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_full(rt, 0, NULL, 2, sc, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_to_host(rt, t, NULL, sizeof V6));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_item(rt, t, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_ndim(rt, t, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_shape(rt, t, NULL, 2));
    {
        uint32_t md = 0;
        size_t mn = 0;
        int64_t msizes[4];
        MISUSE(INVALID_ARGUMENT, dfuse_tensor_meta(rt, t, NULL, msizes, 4, &mn));
        MISUSE(INVALID_ARGUMENT, dfuse_tensor_meta(rt, t, &md, msizes, 4, NULL));
        MISUSE(INVALID_ARGUMENT, dfuse_tensor_meta(rt, t, &md, NULL, 2, &mn));
    }
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_strides(rt, t, NULL, 2));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_dtype(rt, t, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_state(rt, t, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_TRANSPOSE, t, targs, 2, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_TRANSPOSE, t, NULL, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, t, S23, st, 2, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, t, NULL, st, 2, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, t, S23, NULL, 2, 0, &h));
    size_t need = 0;
    MISUSE(INVALID_ARGUMENT, dfuse_pending_dump(rt, 0, NULL, 0, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_pending_dump(rt, 0, NULL, 8, &need)); /* capacity, no buffer */
    MISUSE(INVALID_HANDLE, dfuse_pending_dump(rt, 12345, NULL, 0, &need));
    uint64_t events = 0, dropped = 0;
    MISUSE(INVALID_ARGUMENT, dfuse_trace_start(rt, NULL, 0));
    MISUSE(INVALID_ARGUMENT, dfuse_trace_start(rt, "/nonexistent-dir/trace.json", 0));
    MISUSE(INVALID_ARGUMENT, dfuse_trace_stop(rt, &events, &dropped)); /* none running */
    MISUSE(INVALID_ARGUMENT, dfuse_trace_stop(rt, NULL, &dropped));
    MISUSE(INVALID_ARGUMENT, dfuse_trace_active(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_trace_mark(rt, 0, NULL, "detail"));
    MISUSE(INVALID_ARGUMENT, dfuse_trace_mark(rt, 0, "mark", NULL));
    MISUSE(INVALID_HANDLE, dfuse_trace_mark(rt, 12345, "mark", "detail"));
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_enable(rt, 2));
    MISUSE(INVALID_ARGUMENT, dfuse_log_cuts(rt, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_source_name(rt, 0, "train.py:3 in step")); /* 0: no source */
    MISUSE(INVALID_ARGUMENT, dfuse_source_name(rt, 1, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_point(rt, NULL));
    DfuseProfiledRun taken[2];
    uint64_t n_taken = 0;
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_take(rt, NULL, 2, &n_taken));
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_take(rt, taken, 2, NULL));
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_take(rt, (DfuseProfiledRun *)((char *)taken + 1), 1, &n_taken));
    /* Misaligned out-parameters and arrays: reported, never written through. */
    uint64_t words[4] = {0, 0, 0, 0};
    void *odd = (char *)words + 1;
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_ndim(rt, t, (size_t *)odd));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, (const int64_t *)odd, 1, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_stream_create(rt, (uint64_t *)odd));
    MISUSE(INVALID_ARGUMENT, dfuse_profiler_capture(rt, 16, (uint64_t *)odd));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_shape(rt, t, (int64_t *)odd, 2));
    {
        uint32_t md = 0;
        size_t mn = 0;
        MISUSE(INVALID_ARGUMENT, dfuse_tensor_meta(rt, t, &md, (int64_t *)odd, 2, &mn));
    }
    MISUSE(INVALID_ARGUMENT, dfuse_stats(rt, (DfuseStats *)odd));
    CHECK(words[0] == 0 && words[1] == 0);
    /* Lengths whose byte count cannot exist: rejected before the array is read. */
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, S23, SIZE_MAX / 4, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, in, SIZE_MAX / 16, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_RESHAPE, t, targs, SIZE_MAX, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_to_host(rt, t, words, SIZE_MAX));
    OK(dfuse_tensor_release(rt, t));
    still_usable(rt, __LINE__);
}

static void bad_handles(DfuseRuntime *rt) {
    printf("-- null, stale, double-released, foreign and wrong-kind handles\n");
    DfuseRuntime *other = make_runtime(DFUSE_MODE_STRICT);
    uint64_t foreign = f32_2x3(other), fstream = 0, fevent = 0;
    OK(dfuse_stream_create(other, &fstream));
    OK(dfuse_event_create(other, &fevent));
    uint64_t live = f32_2x3(rt), stale = f32_2x3(rt), s = 0, e = 0, h = 0;
    double ms = 0;
    OK(dfuse_stream_create(rt, &s));
    OK(dfuse_event_create(rt, &e));
    OK(dfuse_tensor_release(rt, stale));
    MISUSE(INVALID_HANDLE, dfuse_tensor_release(rt, stale)); /* double release */
    const uint64_t bad_tensors[4] = {0, stale, foreign, e};
    const uint64_t bad_streams[3] = {s + 1000, fstream, live};
    const uint64_t bad_events[4] = {0, e + 1000, fevent, live};
    DfuseAttrs add = attrs(DFUSE_BINARY_OP_ADD);
    DfuseScalar sc;
    float buf[6];
    int64_t dims[4];
    size_t n;
    uint32_t u;
    bool done;
    const int64_t targs[2] = {0, 1}, st[2] = {3, 1};
    for (int i = 0; i < 4; i++) {
        uint64_t b = bad_tensors[i];
        DfuseOperand in1[2] = {T(b), T(live)}, in2[2] = {T(live), T(b)};
        MISUSE(INVALID_HANDLE, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, in1, 2, 0, &h));
        MISUSE(INVALID_HANDLE, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, in2, 2, 0, &h));
        if (b != 0) MISUSE(INVALID_HANDLE, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &add, in2, 2, b, &h));
        MISUSE(INVALID_HANDLE, dfuse_tensor_to_host(rt, b, buf, sizeof buf));
        MISUSE(INVALID_HANDLE, dfuse_tensor_item(rt, b, &sc));
        MISUSE(INVALID_HANDLE, dfuse_tensor_ndim(rt, b, &n));
        MISUSE(INVALID_HANDLE, dfuse_tensor_shape(rt, b, dims, 4));
        MISUSE(INVALID_HANDLE, dfuse_tensor_meta(rt, b, &u, dims, 4, &n));
        MISUSE(INVALID_HANDLE, dfuse_tensor_strides(rt, b, dims, 4));
        MISUSE(INVALID_HANDLE, dfuse_tensor_dtype(rt, b, &u));
        MISUSE(INVALID_HANDLE, dfuse_tensor_state(rt, b, &u));
        MISUSE(INVALID_HANDLE, dfuse_tensor_retain(rt, b));
        MISUSE(INVALID_HANDLE, dfuse_tensor_release(rt, b));
        MISUSE(INVALID_HANDLE, dfuse_view(rt, 0, DFUSE_VIEW_KIND_TRANSPOSE, b, targs, 2, &h));
        MISUSE(INVALID_HANDLE, dfuse_as_strided(rt, b, S23, st, 2, 0, &h));
        CHECK(h == 0);
    }
    DfuseScalar one = {DFUSE_SCALAR_KIND_FLOAT, 1.0, 0};
    for (int i = 0; i < 3; i++) {
        uint64_t b = bad_streams[i];
        DfuseOperand in[2] = {T(live), T(live)};
        MISUSE(INVALID_HANDLE, dfuse_op(rt, b, DFUSE_OP_KIND_BINARY, &add, in, 2, 0, &h));
        MISUSE(INVALID_HANDLE, dfuse_tensor_full(rt, b, S23, 2, one, DFUSE_DTYPE_F32, &h));
        MISUSE(INVALID_HANDLE, dfuse_stream_synchronize(rt, b));
        MISUSE(INVALID_HANDLE, dfuse_stream_destroy(rt, b));
        MISUSE(INVALID_HANDLE, dfuse_event_record(rt, e, b));
        MISUSE(INVALID_HANDLE, dfuse_event_wait(rt, b, e));
    }
    for (int i = 0; i < 4; i++) {
        uint64_t b = bad_events[i];
        MISUSE(INVALID_HANDLE, dfuse_event_record(rt, b, s));
        MISUSE(INVALID_HANDLE, dfuse_event_wait(rt, s, b));
        MISUSE(INVALID_HANDLE, dfuse_event_query(rt, b, &done));
        MISUSE(INVALID_HANDLE, dfuse_event_synchronize(rt, b));
        MISUSE(INVALID_HANDLE, dfuse_event_elapsed_ms(rt, b, b, &ms));
        MISUSE(INVALID_HANDLE, dfuse_event_destroy(rt, b));
    }
    /* A foreign handle's message says where it came from. */
    MISUSE(INVALID_HANDLE, dfuse_tensor_ndim(rt, foreign, &n));
    CHECK(strstr(dfuse_last_error(), "another runtime") != NULL);
    /* Destroyed streams and events, and destroying them twice. */
    OK(dfuse_stream_destroy(rt, s));
    OK(dfuse_event_destroy(rt, e));
    MISUSE(INVALID_HANDLE, dfuse_stream_destroy(rt, s));
    MISUSE(INVALID_HANDLE, dfuse_stream_synchronize(rt, s));
    MISUSE(INVALID_HANDLE, dfuse_stream_query(rt, s, &done));
    MISUSE(INVALID_HANDLE, dfuse_event_destroy(rt, e));
    MISUSE(INVALID_HANDLE, dfuse_event_query(rt, e, &done));
    MISUSE(INVALID_ARGUMENT, dfuse_stream_destroy(rt, 0)); /* the default stream */
    OK(dfuse_tensor_release(rt, live));
    OK(dfuse_tensor_release(other, foreign));
    OK(dfuse_runtime_destroy(other)); /* its stream and event go with it */
    still_usable(rt, __LINE__);
}

static void bad_enums_and_attrs(DfuseRuntime *rt) {
    printf("-- invalid enum values and attributes\n");
    uint64_t x = f32_2x3(rt), h = 0;
    DfuseOperand in[3] = {T(x), T(x), T(x)};
    DfuseAttrs a = attrs(0);
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, 16, &a, in, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, 0xFFFFFFFFu, &a, in, 1, 0, &h));
    a.sub_op = DFUSE_UNARY_OP_ATANH + 1;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &a, in, 1, 0, &h));
    a.sub_op = 23;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, in, 2, 0, &h));
    a.sub_op = 7;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, in, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, NULL, in, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, NULL, in, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_CAST, NULL, in, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_CAT, NULL, in, 2, 0, &h));
    a = attrs(DFUSE_REDUCE_OP_SUM);
    a.n_dims = DFUSE_MAX_REDUCE_DIMS + 1;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, in, 1, 0, &h));
    a.n_dims = (size_t)-1;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, in, 1, 0, &h));
    /* Attrs full of garbage (never initialized): every field is checked, none is UB. */
    memset(&a, 0xA5, sizeof a);
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, in, 1, 0, &h));
    a.sub_op = DFUSE_REDUCE_OP_SUM;
    a.n_dims = 0; /* keepdim is still 0xA5: "true" */
    uint64_t s = 0;
    size_t nd = 0;
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, in, 1, 0, &s));
    OK(dfuse_tensor_ndim(rt, s, &nd));
    CHECK(nd == 2);
    OK(dfuse_tensor_release(rt, s));
    a = attrs(0);
    a.dim = 1;
    a.limit = -1; /* topk's count: 0 (all) or positive */
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_SORT, &a, in, 1, 0, &h));
    a.limit = 4; /* more than dim 1's 3 positions */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_SORT, &a, in, 1, 0, &h));
    a = attrs(0);
    a.dtype = 8;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_CAST, &a, in, 1, 0, &h));
    a.dtype = 0x80000000u;
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, in, 3, 0, &h));
    DfuseOperand bad_kind[2] = {T(x), T(x)};
    bad_kind[1].kind = 5;
    a = attrs(DFUSE_BINARY_OP_ADD);
    MISUSE(INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, bad_kind, 2, 0, &h));
    DfuseScalar sc = {3, 1.0, 0};
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_full(rt, 0, S23, 2, sc, DFUSE_DTYPE_F32, &h));
    sc.kind = DFUSE_SCALAR_KIND_FLOAT;
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_full(rt, 0, S23, 2, sc, 8, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 9, S23, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, 0xFFFFFFFFu, S23, 2, &h));
    const int64_t one[1] = {0};
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, 8, x, one, 1, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_SLICE, x, one, 1, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_SELECT, x, one, 1, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_view(rt, 0, DFUSE_VIEW_KIND_UNSQUEEZE, x, NULL, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_mode_set(rt, 3));
    MISUSE(INVALID_ARGUMENT, dfuse_mode_push(rt, DFUSE_MODE_FROM_ENV));
    MISUSE(INVALID_ARGUMENT, dfuse_mode_pop(rt)); /* nothing pushed */
    MISUSE(INVALID_ARGUMENT, dfuse_op_group_end(rt, 0)); /* no group open */
    OK(dfuse_tensor_release(rt, x));
    still_usable(rt, __LINE__);
}

static void bad_dtypes_shapes_and_lengths(DfuseRuntime *rt) {
    printf("-- wrong dtypes, shapes, byte lengths and overflowing element counts\n");
    uint64_t x = f32_2x3(rt), h = 0, i4 = 0, b = 0;
    const int32_t iv[4] = {1, 2, 3, 4};
    const int64_t s4[1] = {4};
    OK(dfuse_tensor_from_host(rt, iv, sizeof iv, DFUSE_DTYPE_I32, s4, 1, &i4));
    const int64_t neg[2] = {2, -1}, huge3[3] = {1LL << 32, 1LL << 32, 1LL << 32};
    const int64_t too_big[1] = {1LL << 61}; /* 2^63 bytes of f32: more than isize::MAX */
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6 - 1, 0, S23, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, DFUSE_DTYPE_F64, S23, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, 0, neg, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_from_host(rt, V6, sizeof V6, 0, huge3, 3, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, neg, 2, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, huge3, 3, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_empty(rt, 0, too_big, 1, &h));
    DfuseScalar sc = {DFUSE_SCALAR_KIND_FLOAT, 1.0, 0};
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_full(rt, 0, neg, 2, sc, 0, &h));
    MISUSE(BAD_OP, dfuse_tensor_full(rt, 0, huge3, 3, sc, 0, &h));
    float buf[8];
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_to_host(rt, x, buf, sizeof V6 + 4));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_to_host(rt, x, buf, 0));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_item(rt, x, &sc)); /* 6 elements */
    int64_t dims[1];
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_shape(rt, x, dims, 1));
    MISUSE(INVALID_ARGUMENT, dfuse_tensor_strides(rt, x, dims, 1));
    /* Ops whose operands do not fit: BAD_OP, and nothing recorded. */
    DfuseAttrs a = attrs(DFUSE_BINARY_OP_ADD);
    DfuseOperand xi[2] = {T(x), T(i4)}, xx[3] = {T(x), T(x), T(x)}, ff[2] = {F(1), F(2)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, xi, 2, 0, &h));     /* [2,3]+[4] */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, ff, 2, 0, &h));     /* no tensor */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, xx, 1, 0, &h));     /* one input */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, xx, 3, 0, &h));     /* three */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_WHERE, NULL, xx, 3, 0, &h));    /* f32 cond */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_MATMUL, NULL, xx, 2, 0, &h));   /* 3 vs 2 */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_CAT, &a, xx, 0, 0, &h));        /* no inputs */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, xi, 2, x, &h));
    DfuseOperand xs[2] = {T(x), F(0.5)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, xs, 2, i4, &h)); /* shape of out */
    a = attrs(DFUSE_UNARY_OP_EXP);
    DfuseOperand ii[1] = {T(i4)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &a, ii, 1, i4, &h)); /* f32 into i32 */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &a, ff, 1, 0, &h));  /* scalar input */
    a = attrs(DFUSE_REDUCE_OP_MEAN);
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, ii, 1, 0, &h)); /* mean of int */
    a.n_dims = 2;
    a.dims[0] = 0;
    a.dims[1] = -2; /* the same dim twice */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, xx, 1, 0, &h));
    a.dims[1] = 2;
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, xx, 1, 0, &h));
    a.dims[1] = INT64_MIN;
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, xx, 1, 0, &h));
    a = attrs(DFUSE_REDUCE_OP_ARGMAX);
    a.n_dims = 2;
    a.dims[1] = 1;
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &a, xx, 1, 0, &h)); /* argmax of 2 dims */
    a = attrs(0);
    a.dim = 5;
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_CAT, &a, xi, 2, 0, &h));
    a.dtype = DFUSE_DTYPE_F32;
    DfuseOperand ar[3] = {F(0), F(1), F(0)}, ar_huge[3] = {F(0), F(1e300), F(1)};
    DfuseOperand ar_nan[3] = {F(0), F(NAN), F(1)}, ar_back[3] = {F(5), F(0), F(1)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, ar, 3, 0, &h));      /* step 0 */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, ar_huge, 3, 0, &h)); /* 1e300 */
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, ar_nan, 3, 0, &h));
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, ar_back, 3, 0, &h));
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ARANGE, &a, xx, 3, 0, &h)); /* tensors */
    DfuseOperand cl[3] = {T(x), T(i4), F(1)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_CLAMP, NULL, cl, 3, 0, &h));
    DfuseOperand am[5] = {T(x), T(x), T(x), F(1), F(1)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_ADDMM, NULL, am, 5, 0, &h));
    /* An expanded view cannot be written in place. */
    const int64_t ex_args[2] = {4, -1}, one[1] = {0};
    uint64_t row = 0, ex = 0;
    OK(dfuse_view(rt, 0, DFUSE_VIEW_KIND_SELECT, i4, (const int64_t[]){0, 0}, 2, &row));
    OK(dfuse_view(rt, 0, DFUSE_VIEW_KIND_UNSQUEEZE, i4, one, 1, &b));
    OK(dfuse_view(rt, 0, DFUSE_VIEW_KIND_EXPAND, b, ex_args, 2, &ex));
    a = attrs(DFUSE_UNARY_OP_NEG);
    DfuseOperand exin[1] = {T(ex)};
    MISUSE(BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &a, exin, 1, ex, &h));
    const int32_t want[4] = {1, 2, 3, 4};
    int32_t got[4] = {0};
    OK(dfuse_tensor_to_host(rt, i4, got, sizeof got));
    CHECK(memcmp(got, want, sizeof got) == 0); /* nothing was recorded */
    OK(dfuse_tensor_release(rt, ex));
    OK(dfuse_tensor_release(rt, b));
    OK(dfuse_tensor_release(rt, row));
    OK(dfuse_tensor_release(rt, i4));
    OK(dfuse_tensor_release(rt, x));
    still_usable(rt, __LINE__);
}

static void bad_views(DfuseRuntime *rt) {
    printf("-- views out of range, past the buffer, or with overflowing layouts\n");
    uint64_t x = f32_2x3(rt), h = 0;
#define VIEW(kind, ...)                                                                            \
    misuse(dfuse_view(rt, 0, DFUSE_VIEW_KIND_##kind, x, (const int64_t[]){__VA_ARGS__},           \
                      sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t), &h),              \
           BAD_OP, "dfuse_view(" #kind ", " #__VA_ARGS__ ")", __LINE__)
    VIEW(RESHAPE, 4, 2);
    VIEW(RESHAPE, -1, -1);
    VIEW(RESHAPE, -2, 3);
    VIEW(RESHAPE, 1LL << 62, 1LL << 62);
    VIEW(RESHAPE, 0, -1);
    VIEW(PERMUTE, 0);
    VIEW(PERMUTE, 0, 0);
    VIEW(PERMUTE, 0, 2);
    VIEW(TRANSPOSE, 0, 2);
    VIEW(TRANSPOSE, INT64_MIN, 0);
    VIEW(EXPAND, 4, 3);
    VIEW(EXPAND, 3);
    VIEW(EXPAND, 1LL << 62, 1LL << 62, 2, 3); /* numel overflows */
    VIEW(EXPAND, -2, 2, 3);
    VIEW(SLICE, 0, 0, 2, 0); /* step 0 */
    VIEW(SLICE, 0, 0, 2, -1);
    VIEW(SLICE, 2, 0, 2, 1);
    VIEW(SELECT, 0, 2);
    VIEW(SELECT, 1, -4);
    VIEW(SELECT, 0, INT64_MIN);
    VIEW(SQUEEZE, 3);
    VIEW(UNSQUEEZE, 4);
    VIEW(UNSQUEEZE, INT64_MAX);
#undef VIEW
    /* as_strided must stay inside the 6-element buffer. */
    const int64_t s1[1] = {7}, st1[1] = {1}, s2[2] = {2, 2}, big_st[2] = {1LL << 62, 1LL << 62};
    const int64_t neg_st[1] = {-1}, neg_sz[1] = {-3}, max_st[1] = {INT64_MAX}, two[1] = {2};
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, s1, st1, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, two, st1, 1, 5, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, two, st1, 1, -1, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, two, st1, 1, INT64_MAX, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, s2, big_st, 2, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, two, max_st, 1, 0, &h));
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, neg_sz, st1, 1, 0, &h));
    /* 4 * 2^62 wraps to 0: a wrapped bounds check would let this read far past the buffer. */
    const int64_t five[1] = {5}, st62[1] = {1LL << 62};
    MISUSE(INVALID_ARGUMENT, dfuse_as_strided(rt, x, five, st62, 1, 0, &h));
    /* Negative strides and mismatched counts are malformed layouts: BAD_OP. */
    MISUSE(BAD_OP, dfuse_as_strided(rt, x, two, neg_st, 1, 0, &h));
    CHECK(h == 0);
    OK(dfuse_tensor_release(rt, x));
    still_usable(rt, __LINE__);
}

static bool error_says(const char *a, const char *b, const char *c) {
    const char *m = dfuse_last_error();
    return strstr(m, a) != NULL && strstr(m, b) != NULL && strstr(m, c) != NULL;
}

/* Captures y = x * 2 on the default stream (in defer mode whatever the runtime's mode). */
static uint64_t capture_double(DfuseRuntime *rt, uint64_t x) {
    uint64_t y = 0, g = 0;
    DfuseAttrs mul = attrs(DFUSE_BINARY_OP_MUL);
    DfuseOperand in[2] = {T(x), F(2.0)};
    OK(dfuse_mode_push(rt, DFUSE_MODE_DEFER));
    OK(dfuse_graph_capture_begin(rt, 0));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_capture_begin(rt, 0)); /* already capturing */
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &mul, in, 2, 0, &y));
    /* Pointer misuse is refused before the capture ends: it can still end. */
    MISUSE(INVALID_ARGUMENT, dfuse_graph_capture_end(rt, 0, NULL, 1, &y, 1, &g));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_capture_end(rt, 0, &x, 1, &y, 1, NULL));
    OK(dfuse_graph_capture_end(rt, 0, &x, 1, &y, 1, &g));
    OK(dfuse_mode_pop(rt));
    OK(dfuse_tensor_release(rt, y));
    return g;
}

static void bad_graphs(DfuseRuntime *rt) {
    printf("-- graphs: no capture begun, wrong inputs, null and stale graph handles\n");
    uint64_t x = f32_2x3(rt), stale = f32_2x3(rt), g = 9, outs[2] = {0, 0};
    size_t ni = 9, no = 9;
    MISUSE(INVALID_ARGUMENT, dfuse_graph_capture_end(rt, 0, &x, 1, &x, 1, &g));
    CHECK(g == 0 && strstr(dfuse_last_error(), "no capture begun") != NULL);
    MISUSE(INVALID_ARGUMENT, dfuse_graph_capture_abort(rt, 0));
    MISUSE(INVALID_HANDLE, dfuse_graph_capture_begin(rt, 12345));
    g = capture_double(rt, x);
    OK(dfuse_graph_arity(rt, g, &ni, &no));
    CHECK(ni == 1 && no == 1);
    MISUSE(INVALID_ARGUMENT, dfuse_graph_arity(rt, g, NULL, &no));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, NULL, 1, outs, 1));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, &x, 1, NULL, 1));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, &x, 1, outs, 2));
    CHECK(error_says("outputs", "has 1 outputs", "room for 2"));
    const uint64_t two[2] = {x, x};
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, two, 2, outs, 1));
    CHECK(error_says("graph 0x", "expected 1 inputs", "given 2"));
    uint64_t wide = 0, ints = 0;
    const int64_t S32[2] = {3, 2};
    const int32_t I6[6] = {1, 2, 3, 4, 5, 6};
    OK(dfuse_tensor_from_host(rt, V6, sizeof V6, DFUSE_DTYPE_F32, S32, 2, &wide));
    OK(dfuse_tensor_from_host(rt, I6, sizeof I6, DFUSE_DTYPE_I32, S23, 2, &ints));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, &wide, 1, outs, 1));
    CHECK(error_says("input 0", "expected float32 [2, 3]", "given float32 [3, 2]"));
    MISUSE(INVALID_ARGUMENT, dfuse_graph_launch(rt, 0, g, &ints, 1, outs, 1));
    CHECK(error_says("input 0", "float32", "given int32"));
    OK(dfuse_tensor_release(rt, stale));
    MISUSE(INVALID_HANDLE, dfuse_graph_launch(rt, 0, g, &stale, 1, outs, 1));
    CHECK(error_says("graph 0x", "input 0", "tensor"));
    CHECK(outs[0] == 0);
    OK(dfuse_graph_launch(rt, 0, g, &x, 1, outs, 1));
    float got[6] = {0};
    const uint64_t doubled = outs[0];
    OK(dfuse_tensor_to_host(rt, doubled, got, sizeof got));
    CHECK(got[5] == 12.0f);
    OK(dfuse_graph_destroy(rt, g));
    const uint64_t bad[2] = {0, g};
    for (int i = 0; i < 2; i++) {
        MISUSE(INVALID_HANDLE, dfuse_graph_launch(rt, 0, bad[i], &x, 1, outs, 1));
        CHECK(outs[0] == 0);
        MISUSE(INVALID_HANDLE, dfuse_graph_arity(rt, bad[i], &ni, &no));
        MISUSE(INVALID_HANDLE, dfuse_graph_destroy(rt, bad[i]));
    }
    /* A host read inside a capture: refused, and its ops still run. */
    uint64_t y = 0;
    DfuseAttrs neg = attrs(DFUSE_UNARY_OP_NEG);
    DfuseOperand in[1] = {T(x)};
    OK(dfuse_mode_push(rt, DFUSE_MODE_DEFER));
    OK(dfuse_graph_capture_begin(rt, 0));
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &neg, in, 1, 0, &y));
    OK(dfuse_tensor_to_host(rt, y, got, sizeof got));
    CHECK(got[5] == -6.0f);
    MISUSE(DFUSE_STATUS_NOT_CAPTURABLE, dfuse_graph_capture_end(rt, 0, &x, 1, &y, 1, &g));
    CHECK(g == 0 && strstr(dfuse_last_error(), "host read") != NULL);
    OK(dfuse_graph_capture_begin(rt, 0));
    OK(dfuse_graph_capture_abort(rt, 0));
    OK(dfuse_mode_pop(rt));
    const uint64_t done[5] = {x, wide, ints, doubled, y};
    for (int i = 0; i < 5; i++) OK(dfuse_tensor_release(rt, done[i]));
    still_usable(rt, __LINE__);
}

static void bad_configs_and_env(void) {
    printf("-- bad configs, TORCH_TPU_* and DEFERFUSE_PIPELINE_OPS environment values\n");
    DfuseRuntime *rt = (DfuseRuntime *)(uintptr_t)0x40;
    DfuseConfig cfg;
    OK(dfuse_config_default(&cfg));
    cfg.backend = 7; /* no such backend */
    MISUSE(CONFIG, dfuse_runtime_create(&cfg, &rt));
    CHECK(rt == NULL);
    OK(dfuse_config_default(&cfg));
    cfg.mode = 3;
    MISUSE(CONFIG, dfuse_runtime_create(&cfg, &rt));
    const char *bad_values[4] = {"maybe", "2", "yes", "-1"};
    const char *vars[2] = {"TORCH_TPU_DEFER_AND_FUSE", "TORCH_TPU_LAUNCH_BLOCKING"};
    for (int v = 0; v < 2; v++) {
        for (int i = 0; i < 4; i++) {
            setenv(vars[v], bad_values[i], 1);
            MISUSE(CONFIG, dfuse_runtime_create(NULL, &rt));
            CHECK(strstr(dfuse_last_error(), vars[v]) != NULL);
            OK(dfuse_config_default(&cfg));
            MISUSE(CONFIG, dfuse_runtime_create(&cfg, &rt)); /* mode FROM_ENV reads it too */
            cfg.mode = DFUSE_MODE_DEFER;                      /* an explicit mode does not */
            OK(dfuse_runtime_create(&cfg, &rt));
            OK(dfuse_runtime_destroy(rt));
        }
        unsetenv(vars[v]);
    }
    const char *bad_counts[3] = {"-1", "lots", "6.5"};
    for (int i = 0; i < 3; i++) {
        setenv("DEFERFUSE_PIPELINE_OPS", bad_counts[i], 1);
        MISUSE(CONFIG, dfuse_runtime_create(NULL, &rt));
        CHECK(strstr(dfuse_last_error(), "DEFERFUSE_PIPELINE_OPS") != NULL);
    }
    setenv("DEFERFUSE_PIPELINE_OPS", "0", 1);
    OK(dfuse_runtime_create(NULL, &rt));
    uint64_t ops = 99;
    OK(dfuse_pipeline_ops_set(rt, 64, &ops));
    CHECK(ops == 0);
    OK(dfuse_runtime_destroy(rt));
    unsetenv("DEFERFUSE_PIPELINE_OPS");
    setenv("TORCH_TPU_DEFER_AND_FUSE", " TRUE ", 1); /* case and blanks are forgiven */
    OK(dfuse_runtime_create(NULL, &rt));
    uint32_t mode = 99;
    OK(dfuse_mode_get(rt, &mode));
    CHECK(mode == DFUSE_MODE_DEFER);
    OK(dfuse_runtime_destroy(rt));
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
}

/*
 * Allocations that cannot succeed (2^58 bytes: a valid size, no machine has it) fail with
 * OUT_OF_MEMORY where the memory is first needed, in every mode, and the runtime stays usable.
 */
static void out_of_memory(uint32_t mode) {
    printf("-- out of memory (mode %u)\n", mode);
    DfuseRuntime *rt = make_runtime(mode);
    const int64_t huge[1] = {1LL << 58};
    uint64_t e = 0, h = 0, first = 0;
    DfuseScalar sc = {DFUSE_SCALAR_KIND_INT, 0, 7};
    /* empty() allocates lazily: creating the handle succeeds. */
    OK(dfuse_tensor_empty(rt, DFUSE_DTYPE_U8, huge, 1, &e));
    OK(dfuse_view(rt, 0, DFUSE_VIEW_KIND_SELECT, e, (const int64_t[]){0, 0}, 2, &first));
    DfuseScalar item;
    MISUSE(OOM, dfuse_tensor_item(rt, first, &item));
    CHECK(strstr(dfuse_last_error(), "out of memory") != NULL);
    DfuseAttrs neg = attrs(DFUSE_UNARY_OP_NEG);
    DfuseOperand in[1] = {T(e)};
    DfuseStatus st = dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &neg, in, 1, 0, &h);
    if (mode != DFUSE_MODE_DEFER) {
        misuse(st, OOM, "dfuse_op(neg of 2^58 bytes)", __LINE__);
    } else if (st == DFUSE_STATUS_OK) {
        /* Deferred: it fails when it runs, at the next sync point. */
        MISUSE(OOM, dfuse_stream_synchronize(rt, 0));
        OK(dfuse_tensor_release(rt, h));
    } else {
        misuse(st, OOM, "dfuse_op(deferred neg of 2^58 bytes)", __LINE__);
    }
    MISUSE(OOM, dfuse_tensor_full(rt, 0, huge, 1, sc, DFUSE_DTYPE_U8, &h));
    CHECK(h == 0);
    OK(dfuse_device_synchronize(rt));
    still_usable(rt, __LINE__);
    OK(dfuse_tensor_release(rt, first));
    OK(dfuse_tensor_release(rt, e));
    OK(dfuse_runtime_destroy(rt));
}

int main(void) {
    unsetenv("TORCH_TPU_DEFER_AND_FUSE");
    unsetenv("TORCH_TPU_LAUNCH_BLOCKING");
    CHECK(dfuse_last_error() != NULL && strcmp(dfuse_last_error(), "") == 0);
    bad_runtime_pointers();
    bad_configs_and_env();
    const uint32_t modes[3] = {DFUSE_MODE_STRICT, DFUSE_MODE_DEBUG, DFUSE_MODE_DEFER};
    for (int m = 0; m < 3; m++) {
        printf("== runtime in mode %u\n", modes[m]);
        DfuseRuntime *rt = make_runtime(modes[m]);
        null_and_misaligned_pointers(rt);
        bad_handles(rt);
        bad_enums_and_attrs(rt);
        bad_dtypes_shapes_and_lengths(rt);
        bad_views(rt);
        bad_graphs(rt);
        DfuseStats stats;
        OK(dfuse_stats(rt, &stats));
        OK(dfuse_runtime_destroy(rt));
        out_of_memory(modes[m]);
    }
    printf("misuse cases: %d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
