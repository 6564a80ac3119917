"""R's lazy-load databases (a CRAN package's data/Rdata.rdb + .rdx), read without R: enough of
R's XDR serialization for the data vectors two of the corpus' sources ship (janeaustenr, stringr)."""
from __future__ import annotations

import gzip
import struct
import zlib


class _RUnserialize:
    """Tiny reader for R's XDR serialization (enough for data vectors)."""

    def __init__(self, b):
        self.b, self.p, self.refs = b, 0, []

    def i(self):
        v = struct.unpack(">i", self.b[self.p:self.p + 4])[0]
        self.p += 4
        return v

    def raw(self, n):
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def read(self):
        assert self.raw(2) == b"X\n", "not XDR serialization"
        ver = self.i(); self.i(); self.i()
        if ver == 3:
            self.raw(self.i())
        return self.item()

    def item(self):
        f = self.i(); t = f & 0xFF
        has_attr, has_tag = f & (1 << 9), f & (1 << 10)
        if t in (0, 254, 253, 242, 241, 251, 247, 252, 250):
            return None
        if t == 255:
            idx = f >> 8 or self.i()
            return self.refs[idx - 1]
        if t == 1:
            v = self.item(); self.refs.append(v); return v
        if t == 9:
            n = self.i()
            return None if n == -1 else self.raw(n).decode("utf-8", "replace")
        if t in (2, 6, 17, 23):
            out = []
            while True:
                if has_attr:
                    self.item()
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                f = self.i(); t2 = f & 0xFF
                has_attr, has_tag = f & (1 << 9), f & (1 << 10)
                if t2 in (0, 254):
                    return out
                if t2 not in (2, 6, 17, 23):
                    self.p -= 4
                    out.append((None, self.item()))
                    return out
        if t in (16, 19, 20):
            v = [self.item() for _ in range(self.i())]
        elif t in (10, 13):
            n = self.i(); v = list(struct.unpack(">%di" % n, self.raw(4 * n)))
        elif t == 14:
            n = self.i(); v = list(struct.unpack(">%dd" % n, self.raw(8 * n)))
        elif t == 24:
            v = self.raw(self.i())
        else:
            raise ValueError(f"unsupported R type {t}")
        if has_attr:
            a = dict(self.item() or [])
            if t == 19 and "names" in a:
                return dict(zip(a["names"], v))
        return v


def r_lazyload(base):
    idx = _RUnserialize(gzip.decompress(open(base + ".rdx", "rb").read())).read()
    db = open(base + ".rdb", "rb").read()
    out = {}
    for name, (off, ln) in idx["variables"].items():
        blob = db[off:off + ln]
        n = struct.unpack(">I", blob[:4])[0]
        data = zlib.decompress(blob[4:])
        assert len(data) == n
        out[name] = _RUnserialize(data).read()
    return out
