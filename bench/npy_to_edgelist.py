#!/usr/bin/env python3
"""Writes edge_index.npy ([2, E] int64/int32, C or Fortran order) as a `src dst` text edge list.

Standard library only, so the benchmark needs no NumPy. Usage: npy_to_edgelist.py SRC.npy OUT.txt
"""
import array
import ast
import struct
import sys


def main(src, out):
    with open(src, "rb") as f:
        magic = f.read(6)
        assert magic == b"\x93NUMPY", f"{src}: not a .npy file"
        major = f.read(2)[0]
        hlen = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))[0]
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        code = {"<i8": "q", "<i4": "i"}[header["descr"]]
        rows, e = header["shape"]
        assert rows == 2
        a = array.array(code)
        a.frombytes(f.read())
    # C order stores the src row then the dst row; Fortran order interleaves (src, dst) pairs.
    src_ids, dst_ids = (a[0::2], a[1::2]) if header["fortran_order"] else (a[:e], a[e:])
    with open(out, "w") as f:
        f.write(f"# {e} arcs from {src}\n")
        for i in range(0, e, 1 << 16):
            f.write("".join(f"{s} {d}\n" for s, d in zip(src_ids[i:i + (1 << 16)], dst_ids[i:i + (1 << 16)])))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
