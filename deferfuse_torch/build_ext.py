"""Builds the "tpu" device extension (deferfuse_torch/_C.so) with plain g++ against the
installed torch, and copies libdeferfuse.so next to it (the extension finds it via
rpath $ORIGIN). Object files are cached in build/ and rebuilt only when their source or a
header changed; compiles run in parallel.

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
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        # Every compile runs to the end, so one pass reports every file's errors.
        ok = all(list(ex.map(run, jobs)))
    if not ok:
        raise SystemExit("build_ext: compilation failed")
    pkg = os.path.join(HERE, "deferfuse_torch")
    shutil.copy2(lib, os.path.join(pkg, "libdeferfuse.so"))
    out = os.path.join(pkg, "_C.so")
    if not run(["g++", "-shared", "-o", out, *objs, "-L", pkg, "-ldeferfuse",
         "-L", os.path.join(tdir, "lib"), "-lc10", "-ltorch_cpu",
         "-Wl,-rpath,$ORIGIN", "-Wl,-rpath," + os.path.join(tdir, "lib")]):
        raise SystemExit("build_ext: link failed")
    print(f"build_ext: built {out} ({len(jobs)} of {len(objs)} sources compiled)")


if __name__ == "__main__":
    main()
