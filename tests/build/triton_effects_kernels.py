"""Kernels of tests/build/test_triton_effects.py: what each may write is known by reading it."""
import triton
import triton.language as tl


@triton.jit
def atomic_kernel(counts_ptr, x_ptr, n, BLOCK: tl.constexpr):
    # counts += x, atomically: counts is written, x only read
    o = tl.arange(0, BLOCK)
    m = o < n
    tl.atomic_add(counts_ptr + o, tl.load(x_ptr + o, mask=m), mask=m)


@triton.jit
def asm_kernel(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
    # y's addresses go through inline asm (which may do anything with them): y may be written
    o = tl.arange(0, BLOCK)
    a = tl.inline_asm_elementwise("mov.b64 $0, $1;", "=l,l", [y_ptr + o], dtype=tl.int64, is_pure=True, pack=1)
    tl.store(out_ptr + o, tl.load(x_ptr + o) + a.to(tl.float32))


@triton.jit
def escape_kernel(x_ptr, table_ptr, BLOCK: tl.constexpr):
    # x's address is stored as data into table: whoever reads table may write x
    o = tl.arange(0, BLOCK)
    tl.store(table_ptr + o, (x_ptr + o).to(tl.int64, bitcast=True))


@triton.jit
def branch_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # out is chosen between x and out in a branch, then written: both may be written; y only read
    o = tl.arange(0, BLOCK)
    if n > 3:
        dst = x_ptr
    else:
        dst = out_ptr + n  # (arithmetic in one branch: it stays an scf.if)
    i = 0
    while i < n:
        dst += 1
        i += 1
    tl.store(dst + o, tl.load(y_ptr + o))


@triton.jit
def two_pass_kernel(x_ptr, w_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # a two-pass norm: the first loop reads x and w (a sum of squares), the second reads x and w
    # again and writes y; x and w are read-only (TTIR names the two loops' values alike: sibling scf.for bodies)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < n
        v = tl.load(x_ptr + o, mask=m, other=0.0) * tl.load(w_ptr + o, mask=m, other=0.0)
        acc += v * v
    r = tl.sum(acc, axis=0) / n
    for start in range(0, n, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < n
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=m) * tl.load(w_ptr + o, mask=m) * r, mask=m)


@triton.jit
def reduce_kernel(x_ptr, w_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # reductions (tl.sum, tl.max: tt.reduce, each with a combining region) of x, and a loop summing
    # w whose body starts with an address (TTIR names it as the combiners' first value): only out
    # is written
    o = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n, other=0.0)
    acc = 0.0
    for i in range(0, n):
        acc += tl.load(w_ptr + i)
    tl.store(out_ptr, tl.sum(x, axis=0) * acc + tl.max(x, axis=0))
