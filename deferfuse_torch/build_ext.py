"""Builds the "tpu" device extension (deferfuse_torch/_C.so) with plain g++ against the
installed torch, and copies libdeferfuse.so next to it (the extension finds it via
rpath $ORIGIN). Object files are cached in build/ and rebuilt only when their source or a
header changed; compiles run in parallel. torch's own headers (ATen.h, torch/library.h) are
precompiled once into build/pch, which halves each source's compile time (~35 s -> ~19 s per
file on a CI core; most of a file's time was parsing those headers).

Usage: python build_ext.py [--lib-dir DIR]   (default: $DEFERFUSE_LIB_DIR, else
$CARGO_TARGET_DIR/release, else ../target/release; build it with
`cargo build --release -p deferfuse-ffi`)."""

import argparse
import concurrent.futures
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def default_lib_dir():
    if os.environ.get("DEFERFUSE_LIB_DIR"):
        return os.environ["DEFERFUSE_LIB_DIR"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release")


def run(cmd):
    """Runs cmd; returns False (after printing its output) when it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    return r.returncode == 0


# Sources that define a macro torch's headers read before their first include: they must parse
# the headers themselves, so they do not take the precompiled header.
NO_PCH = {"kineto_profiler.cpp"}  # defines USE_KINETO first


def precompiled_header(cflags, build):
    """Returns the path to pass to -include for torch's precompiled headers, building the .gch
    when it is missing, older than torch's headers, or was built with other flags. GCC uses a
    .gch only when it matches the compile's flags exactly and falls back to parsing the header
    otherwise, so a stale one costs time, never correctness."""
    pch_dir = os.path.join(build, "pch")
    os.makedirs(pch_dir, exist_ok=True)
    header = os.path.join(pch_dir, "torch_headers.h")
    text = "#include <ATen/ATen.h>\n#include <torch/library.h>\n"
    stamp = os.path.join(pch_dir, "flags.txt")
    key = " ".join(cflags) + "\n" + text
    aten = os.path.join(os.path.dirname(torch.__file__), "include", "ATen", "ATen.h")
    gch = header + ".gch"
    fresh = (os.path.exists(gch) and os.path.exists(stamp) and open(stamp).read() == key
             and os.path.getmtime(gch) >= os.path.getmtime(aten))
    if not fresh:
        with open(header, "w") as f:
            f.write(text)
        if not run(["g++", *cflags, "-x", "c++-header", header, "-o", gch]):
            raise SystemExit("build_ext: precompiling torch's headers failed")
        with open(stamp, "w") as f:
            f.write(key)
    return header


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", default=default_lib_dir())
    args = ap.parse_args()
    lib = os.path.join(args.lib_dir, "libdeferfuse.so")
    if not os.path.exists(lib):
        raise SystemExit(f"build_ext: {lib} not found; run `cargo build --release -p deferfuse-ffi` "
                         "in the repository root first (or pass --lib-dir)")
    tdir = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cflags = ["-O2", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w",
              "-I", os.path.join(tdir, "include"),
              "-I", os.path.join(tdir, "include", "torch", "csrc", "api", "include"),
              # kineto_profiler.cpp implements Kineto's IActivityProfiler (torch.profiler).
              "-I", os.path.join(tdir, "include", "kineto"),
              "-I", os.path.join(ROOT, "ffi", "include"),
              # observe.cpp walks Python frames (the source line behind a sync point).
              "-I", sysconfig.get_paths()["include"]]
    build = os.path.join(HERE, "build", "objs")
    os.makedirs(build, exist_ok=True)
    headers = glob.glob(os.path.join(HERE, "csrc", "*.h")) + [
        os.path.join(ROOT, "ffi", "include", "deferfuse.h")]
    newest_header = max(os.path.getmtime(h) for h in headers)
    jobs = []
    objs = []
    for src in sorted(glob.glob(os.path.join(HERE, "csrc", "*.cpp"))):
        obj = os.path.join(build, os.path.basename(src)[:-4] + ".o")
        objs.append(obj)
        if (not os.path.exists(obj) or os.path.getmtime(obj) < os.path.getmtime(src)
                or os.path.getmtime(obj) < newest_header):
            jobs.append(["g++", *cflags, "-c", src, "-o", obj])
    if jobs:
        pch = precompiled_header(cflags, os.path.dirname(build))
        for job in jobs:
            if os.path.basename(job[-3]) not in NO_PCH:
                job[1:1] = ["-include", pch]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        # Every compile runs to the end, so one pass reports every file's errors.
        ok = all(list(ex.map(run, jobs)))
    if not ok:
        raise SystemExit("build_ext: compilation failed")
    pkg = os.path.join(HERE, "deferfuse_torch")
    # Through a new file renamed into place: rewriting the old one in place would change the
    # pages of processes that have it loaded (a test run, a benchmark) under them.
    tmp = os.path.join(pkg, "libdeferfuse.so.tmp")
    shutil.copy2(lib, tmp)
    os.replace(tmp, os.path.join(pkg, "libdeferfuse.so"))
    out = os.path.join(pkg, "_C.so")
    if not run(["g++", "-shared", "-o", out, *objs, "-L", pkg, "-ldeferfuse",
         "-L", os.path.join(tdir, "lib"), "-lc10", "-ltorch_cpu",
         "-Wl,-rpath,$ORIGIN", "-Wl,-rpath," + os.path.join(tdir, "lib")]):
        raise SystemExit("build_ext: link failed")
    print(f"build_ext: built {out} ({len(jobs)} of {len(objs)} sources compiled)")


if __name__ == "__main__":
    main()
