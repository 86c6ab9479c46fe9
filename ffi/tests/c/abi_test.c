/*
 * End-to-end test of the deferfuse C ABI, written as a C user (a PyTorch backend) would use it:
 * it includes only "deferfuse.h" and links libdeferfuse.a. Run by ffi/tests/c_abi.rs.
 *
 * Prints one line per failed check, then "N passed, M failed" as its last line; exits nonzero
 * on any failure.
 */
#include "deferfuse.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int passed = 0;
static int failed = 0;

static void check(int ok, const char *what, int line) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL line %d: %s (last error: \"%s\")\n", line, what, dfuse_last_error());
    }
}

#define CHECK(cond) check((cond), #cond, __LINE__)
/* A call that must return `status`. */
#define EXPECT(status, call) check((call) == (status), #call " == " #status, __LINE__)
#define OK(call) EXPECT(DFUSE_STATUS_OK, call)

static const char *mode_name(uint32_t m) {
    return m == DFUSE_MODE_STRICT ? "strict" : m == DFUSE_MODE_DEBUG ? "debug" : "defer";
}

static DfuseOperand tensor_operand(uint64_t t) {
    DfuseOperand o = {DFUSE_OPERAND_KIND_TENSOR, t, 0.0, 0};
    return o;
}

static DfuseOperand float_operand(double f) {
    DfuseOperand o = {DFUSE_OPERAND_KIND_FLOAT, 0, f, 0};
    return o;
}

static DfuseAttrs attrs_with(uint32_t sub_op) {
    DfuseAttrs a;
    memset(&a, 0, sizeof a);
    a.sub_op = sub_op;
    return a;
}

/* Records a binary op of two operands; returns the result handle (0 on failure). */
static uint64_t binary(DfuseRuntime *rt, uint64_t stream, uint32_t op, DfuseOperand x,
                       DfuseOperand y, uint64_t out, DfuseStatus *status) {
    DfuseAttrs a = attrs_with(op);
    DfuseOperand in[2] = {x, y};
    uint64_t r = 0;
    *status = dfuse_op(rt, stream, DFUSE_OP_KIND_BINARY, &a, in, 2, out, &r);
    return r;
}

static uint64_t from_host_f32(DfuseRuntime *rt, const float *v, const int64_t *sizes,
                              size_t ndim) {
    size_t n = 1;
    for (size_t i = 0; i < ndim; i++) n *= (size_t)sizes[i];
    uint64_t t = 0;
    OK(dfuse_tensor_from_host(rt, v, n * sizeof(float), DFUSE_DTYPE_F32, sizes, ndim, &t));
    CHECK(t != 0);
    return t;
}

/* Reads `n` floats of `t` and compares them with `want` (relative tolerance `rtol`). */
static void expect_f32(DfuseRuntime *rt, uint64_t t, const float *want, size_t n, double rtol,
                       const char *what, int line) {
    float got[16];
    if (n > 16 || dfuse_tensor_to_host(rt, t, got, n * sizeof(float)) != DFUSE_STATUS_OK) {
        check(0, what, line);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double tol = rtol * fabs((double)want[i]) + 1e-6;
        if (fabs((double)got[i] - (double)want[i]) > tol) {
            printf("  %s[%zu]: got %.9g, want %.9g\n", what, i, (double)got[i], (double)want[i]);
            check(0, what, line);
            return;
        }
    }
    check(1, what, line);
}
#define EXPECT_F32(rt, t, want, n, rtol) expect_f32(rt, t, want, n, rtol, #t " values", __LINE__)

/* The whole happy path in one mode, on a runtime created with that mode. */
static void run_mode(uint32_t mode) {
    printf("-- mode %s\n", mode_name(mode));
    DfuseConfig cfg;
    OK(dfuse_config_default(&cfg));
    CHECK(cfg.mode == DFUSE_MODE_FROM_ENV && cfg.backend == DFUSE_BACKEND_FROM_ENV);
    cfg.mode = mode;
    DfuseRuntime *rt = NULL;
    OK(dfuse_runtime_create(&cfg, &rt));
    CHECK(rt != NULL);
    if (rt == NULL) return;
    uint32_t got_mode = 99;
    OK(dfuse_mode_get(rt, &got_mode));
    CHECK(got_mode == mode);

    const int64_t s23[2] = {2, 3};
    const float av[6] = {1, 2, 3, 4, 5, 6};
    const float bv[6] = {0.5f, -1, 2, 0, 1.5f, -2};
    uint64_t a = from_host_f32(rt, av, s23, 2);
    uint64_t b = from_host_f32(rt, bv, s23, 2);
    DfuseStatus st;

    /* c = a + b; d = c * 2.0; e = exp(d); s = e.sum(-1, keepdim=True) */
    uint64_t c = binary(rt, 0, DFUSE_BINARY_OP_ADD, tensor_operand(a), tensor_operand(b), 0, &st);
    EXPECT(DFUSE_STATUS_OK, st);
    /* The config's mode took effect: defer records, debug runs each op before returning. */
    uint32_t cstate = 99;
    OK(dfuse_tensor_state(rt, c, &cstate));
    if (mode == DFUSE_MODE_DEFER) CHECK(cstate == DFUSE_BUFFER_STATE_DEFERRED);
    if (mode == DFUSE_MODE_DEBUG) CHECK(cstate == DFUSE_BUFFER_STATE_MATERIALIZED);
    uint64_t d = binary(rt, 0, DFUSE_BINARY_OP_MUL, tensor_operand(c), float_operand(2.0), 0, &st);
    EXPECT(DFUSE_STATUS_OK, st);
    DfuseAttrs ua = attrs_with(DFUSE_UNARY_OP_EXP);
    DfuseOperand din = tensor_operand(d);
    uint64_t e = 0;
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &ua, &din, 1, 0, &e));
    DfuseAttrs ra = attrs_with(DFUSE_REDUCE_OP_SUM);
    ra.dims[0] = -1;
    ra.n_dims = 1;
    ra.keepdim = true;
    DfuseOperand ein = tensor_operand(e);
    uint64_t s = 0;
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &ra, &ein, 1, 0, &s));

    float cw[6], dw[6], ew[6], sw[2] = {0, 0};
    for (int i = 0; i < 6; i++) {
        cw[i] = av[i] + bv[i];
        dw[i] = cw[i] * 2.0f;
        ew[i] = expf(dw[i]);
        sw[i / 3] += ew[i];
    }
    EXPECT_F32(rt, c, cw, 6, 0.0);
    EXPECT_F32(rt, d, dw, 6, 0.0);
    EXPECT_F32(rt, e, ew, 6, 1e-5);
    EXPECT_F32(rt, s, sw, 2, 1e-5);
    size_t ndim = 0;
    int64_t shape[4] = {0, 0, 0, 0};
    OK(dfuse_tensor_ndim(rt, s, &ndim));
    OK(dfuse_tensor_shape(rt, s, shape, 4));
    CHECK(ndim == 2 && shape[0] == 2 && shape[1] == 1);

    /* bt = b.transpose(0, 1) (a view); m = a @ bt */
    const int64_t targs[2] = {0, 1};
    uint64_t bt = 0;
    OK(dfuse_view(rt, 0, DFUSE_VIEW_KIND_TRANSPOSE, b, targs, 2, &bt));
    int64_t strides[2] = {0, 0};
    OK(dfuse_tensor_strides(rt, bt, strides, 2));
    CHECK(strides[0] == 1 && strides[1] == 3);
    float btw[6];
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) btw[i * 2 + j] = bv[j * 3 + i];
    EXPECT_F32(rt, bt, btw, 6, 0.0);
    DfuseOperand mm_in[2] = {tensor_operand(a), tensor_operand(bt)};
    uint64_t m = 0;
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_MATMUL, NULL, mm_in, 2, 0, &m));
    float mw[4];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            mw[i * 2 + j] = 0;
            for (int k = 0; k < 3; k++) mw[i * 2 + j] += av[i * 3 + k] * bv[j * 3 + k];
        }
    EXPECT_F32(rt, m, mw, 4, 1e-6);
    uint32_t dt = 99;
    OK(dfuse_tensor_dtype(rt, m, &dt));
    CHECK(dt == DFUSE_DTYPE_F32);

    /* In place: a += b (out = a); the result is a itself. */
    uint64_t r = binary(rt, 0, DFUSE_BINARY_OP_ADD, tensor_operand(a), tensor_operand(b), a, &st);
    EXPECT(DFUSE_STATUS_OK, st);
    CHECK(r == a);
    EXPECT_F32(rt, a, cw, 6, 0.0);
    uint32_t state = 99;
    OK(dfuse_tensor_state(rt, a, &state));
    CHECK(state == DFUSE_BUFFER_STATE_MATERIALIZED);

    /* full and item */
    const int64_t s1[1] = {1};
    DfuseScalar v = {DFUSE_SCALAR_KIND_FLOAT, 3.5, 0};
    uint64_t f = 0;
    OK(dfuse_tensor_full(rt, 0, s1, 1, v, DFUSE_DTYPE_F32, &f));
    DfuseScalar item = {99, 0, 0};
    OK(dfuse_tensor_item(rt, f, &item));
    CHECK(item.kind == DFUSE_SCALAR_KIND_FLOAT && item.f == 3.5);
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_tensor_item(rt, a, &item));

    /* Mode push/pop on this thread. */
    OK(dfuse_mode_push(rt, DFUSE_MODE_DEBUG));
    OK(dfuse_mode_get(rt, &got_mode));
    CHECK(got_mode == DFUSE_MODE_DEBUG);
    uint64_t neg = 0;
    DfuseAttrs na = attrs_with(DFUSE_UNARY_OP_NEG);
    DfuseOperand bin = tensor_operand(b);
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &na, &bin, 1, 0, &neg));
    OK(dfuse_mode_pop(rt));
    OK(dfuse_mode_get(rt, &got_mode));
    CHECK(got_mode == mode);
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_mode_pop(rt));

    /* An op group in strict mode: two ops recorded inside it run as one program at its end,
     * the released intermediate never written; -(-b) == b. */
    OK(dfuse_mode_push(rt, DFUSE_MODE_STRICT));
    DfuseStats before_group, after_group;
    OK(dfuse_stats(rt, &before_group));
    OK(dfuse_op_group_begin(rt));
    uint64_t g1 = 0, g2 = 0;
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &na, &bin, 1, 0, &g1));
    DfuseOperand g1_in = tensor_operand(g1);
    OK(dfuse_op(rt, 0, DFUSE_OP_KIND_UNARY, &na, &g1_in, 1, 0, &g2));
    OK(dfuse_tensor_release(rt, g1));
    OK(dfuse_op_group_end(rt, 0));
    OK(dfuse_stats(rt, &after_group));
    CHECK(after_group.programs_run - before_group.programs_run == 1);
    OK(dfuse_mode_pop(rt));
    EXPECT_F32(rt, g2, bv, 6, 0.0);
    OK(dfuse_tensor_release(rt, g2));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op_group_end(rt, 0));

    /* A second stream: x = -b on s2; record an event; the default stream waits for it and
     * computes y = x + 1. */
    uint64_t s2 = 0, ev = 0;
    OK(dfuse_stream_create(rt, &s2));
    OK(dfuse_event_create(rt, &ev));
    CHECK(s2 != 0 && ev != 0);
    DfuseOperand xin = tensor_operand(b);
    uint64_t x = 0;
    OK(dfuse_op(rt, s2, DFUSE_OP_KIND_UNARY, &na, &xin, 1, 0, &x));
    OK(dfuse_event_record(rt, ev, s2));
    OK(dfuse_event_wait(rt, 0, ev));
    uint64_t y = binary(rt, 0, DFUSE_BINARY_OP_ADD, tensor_operand(x), float_operand(1.0), 0, &st);
    EXPECT(DFUSE_STATUS_OK, st);
    OK(dfuse_stream_synchronize(rt, 0));
    OK(dfuse_event_synchronize(rt, ev));
    bool done = false;
    OK(dfuse_event_query(rt, ev, &done));
    CHECK(done);
    float yw[6], negw[6];
    for (int i = 0; i < 6; i++) {
        negw[i] = -bv[i];
        yw[i] = -bv[i] + 1.0f;
    }
    EXPECT_F32(rt, y, yw, 6, 0.0);
    EXPECT_F32(rt, neg, negw, 6, 0.0);
    OK(dfuse_event_destroy(rt, ev));
    OK(dfuse_stream_destroy(rt, s2));
    OK(dfuse_device_synchronize(rt));

    DfuseStats stats;
    memset(&stats, 0, sizeof stats);
    OK(dfuse_stats(rt, &stats));
    CHECK(stats.programs_compiled > 0);
    CHECK(stats.ops_recorded > 0);
    CHECK(stats.sync_points[DFUSE_SYNC_REASON_HOST_READ] > 0);
    printf("   ops_recorded=%llu programs_compiled=%llu programs_run=%llu cache_hits=%llu\n",
           (unsigned long long)stats.ops_recorded, (unsigned long long)stats.programs_compiled,
           (unsigned long long)stats.programs_run, (unsigned long long)stats.cache_hits);

    uint64_t all[] = {a, b, c, d, e, s, bt, m, f, neg, x, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) OK(dfuse_tensor_release(rt, all[i]));
    OK(dfuse_runtime_destroy(rt));
}

static void error_paths(void) {
    printf("-- error paths\n");
    /* A NULL config means the defaults (mode from the environment). */
    DfuseRuntime *rt = NULL;
    OK(dfuse_runtime_create(NULL, &rt));
    CHECK(rt != NULL);
    if (rt == NULL) return;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_runtime_create(NULL, NULL));
    CHECK(strstr(dfuse_last_error(), "out") != NULL);

    DfuseConfig cfg;
    OK(dfuse_config_default(&cfg));
    cfg.backend = 7;
    DfuseRuntime *bad = (DfuseRuntime *)1;
    EXPECT(DFUSE_STATUS_CONFIG, dfuse_runtime_create(&cfg, &bad));
    CHECK(bad == NULL);
    CHECK(strstr(dfuse_last_error(), "expected DFUSE_BACKEND_CPU") != NULL);
    /* A PJRT plugin that is not there: a config error naming the path. */
    cfg.backend = DFUSE_BACKEND_PJRT;
    cfg.pjrt_plugin = "/nonexistent/pjrt_plugin.so";
    EXPECT(DFUSE_STATUS_CONFIG, dfuse_runtime_create(&cfg, &bad));
    CHECK(strstr(dfuse_last_error(), "/nonexistent/pjrt_plugin.so") != NULL);
    cfg.backend = DFUSE_BACKEND_CPU;
    cfg.pjrt_plugin = NULL;

    const int64_t s23[2] = {2, 3};
    const int64_t s4[1] = {4};
    const float v6[6] = {1, 2, 3, 4, 5, 6};
    const float v4[4] = {1, 2, 3, 4};

    /* NULL out-pointer */
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_tensor_from_host(rt, v6, sizeof v6, DFUSE_DTYPE_F32, s23, 2, NULL));
    CHECK(strstr(dfuse_last_error(), "dfuse_tensor_from_host") != NULL);
    CHECK(strstr(dfuse_last_error(), "out is NULL") != NULL);
    /* NULL array with a non-zero length */
    uint64_t t = 0;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_tensor_from_host(rt, v6, sizeof v6, DFUSE_DTYPE_F32, NULL, 2, &t));
    CHECK(strstr(dfuse_last_error(), "sizes is NULL") != NULL);
    /* negative size */
    const int64_t neg_sizes[2] = {2, -3};
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_tensor_from_host(rt, v6, sizeof v6, DFUSE_DTYPE_F32, neg_sizes, 2, &t));
    /* unknown dtype */
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_tensor_from_host(rt, v6, sizeof v6, 42, s23, 2, &t));
    CHECK(strstr(dfuse_last_error(), "42") != NULL);
    /* wrong byte count */
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_tensor_from_host(rt, v6, 5, DFUSE_DTYPE_F32, s23, 2, &t));

    uint64_t a = from_host_f32(rt, v6, s23, 2);
    uint64_t b = from_host_f32(rt, v4, s4, 1);

    /* bad shapes: [2,3] + [4] */
    DfuseStatus st;
    uint64_t r = binary(rt, 0, DFUSE_BINARY_OP_ADD, tensor_operand(a), tensor_operand(b), 0, &st);
    EXPECT(DFUSE_STATUS_BAD_OP, st);
    CHECK(r == 0);
    CHECK(strstr(dfuse_last_error(), "add") != NULL);

    /* unknown op kind, unknown sub-op, missing attrs, unknown operand kind */
    DfuseOperand in[2] = {tensor_operand(a), tensor_operand(a)};
    DfuseAttrs at = attrs_with(0);
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, 99, &at, in, 2, 0, &r));
    CHECK(strstr(dfuse_last_error(), "99") != NULL);
    at.sub_op = 1000;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &at, in, 2, 0, &r));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, NULL, in, 2, 0, &r));
    in[1].kind = 77;
    at.sub_op = DFUSE_BINARY_OP_ADD;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &at, in, 2, 0, &r));
    /* unknown cast dtype; reduce over an out-of-range dim is a bad op */
    at.dtype = 8;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_CAST, &at, in, 1, 0, &r));
    DfuseAttrs ra = attrs_with(DFUSE_REDUCE_OP_SUM);
    ra.dims[0] = 2;
    ra.n_dims = 1;
    EXPECT(DFUSE_STATUS_BAD_OP, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &ra, in, 1, 0, &r));
    ra.n_dims = 9;
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_op(rt, 0, DFUSE_OP_KIND_REDUCE, &ra, in, 1, 0, &r));

    /* to_host with the wrong byte count, and with a NULL buffer */
    float out6[6];
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_tensor_to_host(rt, a, out6, 5 * sizeof(float)));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_tensor_to_host(rt, a, NULL, sizeof out6));

    /* shape with too small an array; views with the wrong number of args */
    int64_t sh[1];
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_tensor_shape(rt, a, sh, 1));
    const int64_t one[1] = {0};
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT,
           dfuse_view(rt, 0, DFUSE_VIEW_KIND_TRANSPOSE, a, one, 1, &r));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_view(rt, 0, 42, a, one, 1, &r));
    const int64_t huge[1] = {100};
    const int64_t unit[1] = {1};
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_as_strided(rt, a, huge, unit, 1, 0, &r));

    /* invalid modes */
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_mode_set(rt, 3));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_mode_push(rt, 0xFFFFFFFFu));

    /* a stale handle after its last release */
    OK(dfuse_tensor_retain(rt, b));
    OK(dfuse_tensor_release(rt, b));
    OK(dfuse_tensor_release(rt, b));
    size_t nd = 0;
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_tensor_ndim(rt, b, &nd));
    CHECK(strlen(dfuse_last_error()) > 0);
    CHECK(strstr(dfuse_last_error(), "stale") != NULL);
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_tensor_release(rt, b));
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_tensor_to_host(rt, 0, out6, sizeof out6));
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_event_record(rt, 12345, 0));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_stream_destroy(rt, 0));

    /* the message survives successful calls */
    size_t before = strlen(dfuse_last_error());
    OK(dfuse_tensor_ndim(rt, a, &nd));
    CHECK(nd == 2 && strlen(dfuse_last_error()) == before);

    OK(dfuse_tensor_release(rt, a));
    OK(dfuse_runtime_destroy(rt));

    /* calls on a destroyed runtime pointer, and on NULL */
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_tensor_ndim(rt, a, &nd));
    CHECK(strstr(dfuse_last_error(), "not live") != NULL);
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_device_synchronize(rt));
    EXPECT(DFUSE_STATUS_INVALID_HANDLE, dfuse_runtime_destroy(rt));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_device_synchronize(NULL));
    CHECK(strstr(dfuse_last_error(), "rt is NULL") != NULL);
}

/* A mode set is not a push: a pop after it has nothing to undo. Runs last: the set mode stays
 * this thread's mode. */
static void set_is_not_a_push(void) {
    DfuseRuntime *rt = NULL;
    OK(dfuse_runtime_create(NULL, &rt));
    OK(dfuse_mode_set(rt, DFUSE_MODE_DEFER));
    EXPECT(DFUSE_STATUS_INVALID_ARGUMENT, dfuse_mode_pop(rt));
    uint32_t got = 0;
    OK(dfuse_mode_get(rt, &got));
    CHECK(got == DFUSE_MODE_DEFER);
    OK(dfuse_runtime_destroy(rt));
}

int main(void) {
    const char *version = dfuse_version();
    printf("deferfuse %s\n", version);
    CHECK(version != NULL && strlen(version) > 0);
    CHECK(strcmp(dfuse_last_error(), "") == 0);
    const uint32_t modes[3] = {DFUSE_MODE_STRICT, DFUSE_MODE_DEBUG, DFUSE_MODE_DEFER};
    for (int i = 0; i < 3; i++) run_mode(modes[i]);
    error_paths();
    set_is_not_a_push();
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
