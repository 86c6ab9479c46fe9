"""Seeing where the time goes: deferfuse_torch.trace writes a Chrome trace of a training step
with its events in stream order, explain() names the source lines behind sync points and CPU
fallbacks, and report() writes one HTML page with the timeline, the region table and the
region graphs."""

import json
import os
import shutil
import subprocess

import pytest
import torch

import deferfuse_torch
from deferfuse_torch.report import COLOURS as report_colours


def make_step():
    """A small model's training step on tpu that reads its loss with .item()."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 2)).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8).to("tpu")
    y = torch.tensor([0, 1, 1, 0]).to("tpu")

    def step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # the sync point explain() must name
    return step


ITEM_LINE = make_step.__code__.co_firstlineno + 14


@pytest.fixture
def defer():
    with deferfuse_torch.mode("defer"):
        yield
    torch.tpu.synchronize()


@pytest.fixture
def defer_unpipelined(defer):
    """Defer mode with pipelining off: this small step then flushes once, at its loss.item().
    With it on, where the 48-op threshold first meets a kernel op moves with the op count of
    the step's loss (a pipelined flush in the backward leaves the optimizer pending past the
    read, for explain's own synchronize)."""
    before = deferfuse_torch.set_pipeline_ops(0)
    yield
    deferfuse_torch.set_pipeline_ops(before)


def spans(trace, cat):
    e = [e for e in trace["traceEvents"] if e.get("cat") == cat and e["ph"] == "X"]
    return sorted(e, key=lambda e: e["ts"])


def test_trace_of_a_training_step_is_chrome_json_with_its_events_in_stream_order(defer_unpipelined,
                                                                                  tmp_path):
    step = make_step()
    # The first steps compile and plan (the second one has grads to accumulate into). Each ends
    # in a synchronize, as trace() starts with one: where defer mode's pipelining cuts a step's
    # trace depends on what the step before left pending, so the traced step is the same trace.
    for _ in range(2):
        step()
        torch.tpu.synchronize()
    path = tmp_path / "step.json"
    with deferfuse_torch.trace(path):
        step()
    trace = json.loads(path.read_text())
    flushes = spans(trace, "flush")
    assert [f["args"]["reason"] for f in flushes][0] == "host_read"
    assert all(p["args"]["hit"] for p in spans(trace, "plan")), "a steady step reuses its plans"
    runs = spans(trace, "run")
    assert len(runs) >= 5
    # Independent regions of one wave may run side by side on CPU worker tracks; each track
    # (the stream's own, or one worker's) still runs one program at a time.
    for tid in {r["tid"] for r in runs}:
        track = [r for r in runs if r["tid"] == tid]
        for a, b in zip(track, track[1:]):
            assert b["ts"] >= a["ts"] + a["dur"], "one track runs one program at a time"
    assert runs[0]["ts"] >= flushes[0]["ts"], "a program runs after the flush that planned it"
    assert any(r["name"].startswith("matmul") for r in runs)
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "mark"]
    assert [m["name"] for m in marks] == ["sync: item"]
    assert marks[0]["args"]["detail"].endswith(f"test_observe.py:{ITEM_LINE} in step")
    assert trace["otherData"]["dropped_events"] == 0


def test_explain_names_the_line_of_an_item_that_forced_a_sync(defer_unpipelined):
    r = deferfuse_torch.explain(make_step())
    assert r.sync_points == {"host_read": 1}
    (where, n), = r.sync_lines["item"].items()
    assert where.endswith(f"test_observe.py:{ITEM_LINE} in step") and n == 1
    assert isinstance(r.result, float)
    assert r.ops_recorded > 20 and r.programs_run > 5 and r.programs_compiled >= 0
    assert r.regions and r.regions[0]["ms"] >= r.regions[-1]["ms"]
    assert "test_observe.py" in str(r) and r.as_dict()["sync_points"] == {"host_read": 1}
    assert set(r.cut_ops) == set(r.cuts), "each cut reason lists the ops it cut at"


def test_explain_names_the_line_of_an_op_that_fell_back_to_the_cpu(defer):
    x = torch.randn(5).to("tpu")

    def f():
        return torch.special.i1e(x)  # no tpu kernel: runs on the CPU fallback
    line = f.__code__.co_firstlineno + 1
    r = deferfuse_torch.explain(f)
    (op, lines), = r.fallbacks.items()
    assert op.startswith("aten::special_i1e")
    assert list(lines) == [f"{__file__}:{line} in f"]


def cut_by_a_matmul(x, w):
    a = x.exp()
    b = a @ w  # a matmul is no loop op: the region is cut here
    return b.relu().sum().item()


MATMUL_LINE = cut_by_a_matmul.__code__.co_firstlineno + 2


def test_explain_names_the_line_of_the_op_a_fusion_cut_was_at(defer):
    x, w = torch.randn(8, 8).to("tpu"), torch.randn(8, 8).to("tpu")
    r = deferfuse_torch.explain(cut_by_a_matmul, x, w)
    lines = r.cut_lines["unfusable"]
    assert f"test_observe.py:{MATMUL_LINE} in cut_by_a_matmul" in " ".join(lines), lines
    assert f"test_observe.py:{MATMUL_LINE}" in str(r)


def one_of_each_kind(x, w, v, cols):
    y = x @ w  # gemm
    e = (v * 2 + 1).exp()  # elementwise (a shape of its own: its own region)
    t = cols.t().contiguous()  # copy: only a layout change
    return y.sum(1), e, t  # reduce


def test_explain_splits_the_programs_time_by_kind(defer):
    x, w = torch.randn(64, 32).to("tpu"), torch.randn(32, 16).to("tpu")
    v, cols = torch.randn(7).to("tpu"), torch.randn(16, 24).to("tpu")
    r = deferfuse_torch.explain(one_of_each_kind, x, w, v, cols)
    assert set(r.device_ms) == {"gemm", "elementwise", "reduce", "copy"}, r.device_ms
    assert all(ms > 0 for ms in r.device_ms.values())
    total = sum(e["ms"] for e in r.regions)
    assert sum(r.device_ms.values()) == pytest.approx(total)
    assert "program time" in str(r) and r.as_dict()["device_ms"] == r.device_ms


@pytest.mark.parametrize("label, kind", [
    ("matmul.float32", "gemm"), ("matmul.float32 + add+relu", "gemm"),
    ("row kernel mul+sum", "reduce"), ("fused mul+add", "elementwise"), ("fused copy", "copy"),
    ("gather", "kernel"), ("arange.int64", "kernel"), ("graph of 12 steps", "graph")])
def test_a_program_kind_is_read_off_its_timeline_label(label, kind):
    assert deferfuse_torch.observe.program_kind(label) == kind


def test_nothing_is_noted_outside_explain_and_trace(defer):
    make_step()()
    torch.ops.deferfuse.observe_take()
    assert deferfuse_torch.explain(lambda: None).sync_lines == {}


def test_report_writes_one_page_with_the_timeline_regions_and_graphs(defer, tmp_path):
    path = tmp_path / "step.html"
    r = deferfuse_torch.report(path, make_step())
    page = path.read_text()
    for part in ['id="timeline"', '<svg class="timeline"', 'id="regions"', 'id="graphs"',
                 r.regions[0]["label"]]:
        assert part in page, part
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), \
        "self-contained"
    if shutil.which("dot"):
        assert page.count("<svg") > 1, "graphs drawn by graphviz"
    else:
        assert "Graphviz <code>dot</code> is not installed" in page and "digraph" in page


def test_report_without_graphviz_shows_each_graph_as_dot_source_with_a_note(monkeypatch):
    from deferfuse_torch.report import _graph
    monkeypatch.setattr(shutil, "which", lambda name: None)
    html = _graph({"dot": "digraph g { a -> b }", "text": "loop"})
    assert "Graphviz <code>dot</code> is not installed" in html, html
    assert "apt-get install graphviz" in html and "digraph g { a -&gt; b }" in html, html


def chromium():
    """Headless Chromium, or a skip saying how to get it (a failure where CI installs it:
    DEFERFUSE_REQUIRE_CHROMIUM=1)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("DEFERFUSE_REQUIRE_CHROMIUM"):
            pytest.fail("DEFERFUSE_REQUIRE_CHROMIUM is set but chromium is not installed "
                        "(.ci/setup installs it: apt-get install chromium)")
        pytest.skip("headless Chromium is not installed (apt-get install chromium)")
    return exe


def artifact_dir():
    """Where a test leaves what a person looks at afterwards (CI keeps it):
    $DEFERFUSE_ARTIFACT_DIR, else target/test-artifacts in the repository."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    d = os.environ.get("DEFERFUSE_ARTIFACT_DIR") or os.path.join(root, "target", "test-artifacts")
    os.makedirs(d, exist_ok=True)
    return d


def pixels_near(image, hex_colour, tol=4):
    """How many pixels of `image` (PIL) are within `tol` of `hex_colour` in each channel."""
    want = tuple(int(hex_colour[k:k + 2], 16) for k in (1, 3, 5))
    return sum(n for n, px in image.getcolors(maxcolors=1 << 24)
               if all(abs(a - b) <= tol for a, b in zip(px[:3], want)))


def test_report_renders_in_headless_chromium_with_the_timeline_drawn(defer, tmp_path):
    Image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    exe = chromium()
    step = make_step()
    step()
    path = tmp_path / "step.html"
    deferfuse_torch.report(path, step)
    shot = os.path.join(artifact_dir(), "report.png")
    if os.path.exists(shot):
        os.remove(shot)
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1200,1000", path.as_uri()],
                   check=True, timeout=120, capture_output=True)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1000)
    # The timeline's bars, in report.py's colours: the host track's flush, the programs' runs.
    flush = pixels_near(image, report_colours["flush"])
    runs = pixels_near(image, report_colours["run"]) + pixels_near(image, report_colours["wave"])
    assert flush > 500, f"the flush bar is drawn ({flush} pixels); see {shot}"
    assert runs > 50, f"program runs are drawn ({runs} pixels); see {shot}"


SCRIPT = """
import torch, deferfuse_torch
x = torch.ones(4, 4).to("tpu")
with deferfuse_torch.mode("defer"):
    y = (x * 2).exp() @ x
    print(y.sum().item())
"""


def run_script(tmp_path, **env):
    import sys
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    e = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(deferfuse_torch.__file__)),
             **env)
    return subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                          timeout=300, check=True)


def test_DEFERFUSE_TRACE_writes_the_whole_runs_timeline_at_exit(tmp_path):
    path = tmp_path / "run.json"
    run_script(tmp_path, DEFERFUSE_TRACE=str(path))
    trace = json.loads(path.read_text())
    assert [f["args"]["reason"] for f in spans(trace, "flush")] == ["host_read"]
    assert spans(trace, "run"), "the fused program ran"
    # The source lines are noted for the whole run, as trace() notes them for its block.
    marks = [e for e in trace["traceEvents"] if e.get("cat") == "mark"]
    assert [m["args"]["detail"] for m in marks] == [f"{tmp_path}/user_script.py:6 in <module>"]
    cuts = {e["name"]: e["args"] for e in trace["traceEvents"] if e.get("cat") == "cut"}
    assert cuts["cut (unfusable)"]["source"] == f"{tmp_path}/user_script.py:5 in <module>", cuts


LOG_SCRIPT = """
import torch, deferfuse_torch
x, w = torch.randn(8, 8).to("tpu"), torch.randn(8, 8).to("tpu")
with deferfuse_torch.mode("defer"):
    a = x.exp()
    b = a @ w  # CUT: a matmul is no loop op
    print(b.relu().sum().item())  # SYNC
    torch.special.i0(x)  # FALLBACK: no tpu kernel
"""


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """The stderr of LOG_SCRIPT run with DEFERFUSE_LOG at the level that prints cuts, and a
    function giving "user_log.py:N in <module>" for the line holding a marker."""
    import sys
    script = tmp_path_factory.mktemp("log") / "user_log.py"
    script.write_text(LOG_SCRIPT)
    e = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(deferfuse_torch.__file__)),
             DEFERFUSE_LOG="deferfuse_runtime=debug")
    r = subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                       timeout=300, check=True)
    lines = LOG_SCRIPT.split("\n")

    def at(marker):
        n = next(i for i, l in enumerate(lines) if marker in l) + 1
        return f"{script}:{n} in <module>"
    return r.stderr.splitlines(), at


def test_DEFERFUSE_LOG_names_the_source_line_of_a_sync_point(logged):
    stderr, at = logged
    assert f"deferfuse_torch: sync item at {at('SYNC')}" in stderr, stderr


def test_DEFERFUSE_LOG_names_the_source_line_of_a_fusion_cut(logged):
    stderr, at = logged
    cuts = [l for l in stderr if l.endswith(f"cut (unfusable) at {at('CUT')}")]
    assert cuts, "\n".join(stderr)
    # It follows the runtime's own cut line, which names the op.
    before = stderr[stderr.index(cuts[0]) - 1]
    assert "cut op=" in before and "matmul" in before, before


def test_DEFERFUSE_LOG_names_the_source_line_of_a_cpu_fallback(logged):
    stderr, at = logged
    fallbacks = [l for l in stderr if l.startswith("deferfuse_torch: fallback aten::")]
    assert fallbacks and all(l.endswith(f" at {at('FALLBACK')}") for l in fallbacks), stderr


def test_every_stats_counter_and_reason_is_documented_in_the_readme():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f:
        table = f.read().split("**The counters.**", 1)[1].split("\n## ", 1)[0]
    s = deferfuse_torch.stats()
    names = [k for k in s if k not in ("cuts", "sync_points")] + ["cuts[reason]",
                                                                  "sync_points[reason]"]
    names += list(s["cuts"]) + list(s["sync_points"])
    missing = [n for n in names if f"`{n}`" not in table]
    assert not missing, f"README's counters table does not name {missing}"
