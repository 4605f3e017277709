#!/usr/bin/env python3
"""c10d conformance: a torch.distributed backend against Gloo and a local reference.

    neuronrun -n 4 tests/python/scripts/c10d_conformance.py [--backend neuron] [--quick]

The default group is Gloo. For each group shape (the world, the even ranks,
ranks 1.., the last rank alone) every rank creates a Gloo group and a group of
the backend under test (X), in the same order; the members then run every
collective and point-to-point operation on X, for every dtype, reduce op and
mode (blocking, and async_op=True then wait(), checking the Work), and compare
the outputs bitwise with
  (a) the same operation on the Gloo group, where Gloo supports it, and
  (b) always, a reference computed here: every input is a deterministic
      function of (global rank, op, dtype, reduce op, count, seed), so every
      rank can compute every other rank's input.

Reference semantics (what X must do): reductions fold in group-rank order;
float16 and bfloat16 accumulate in float32 and round once; AVG is the sum
divided by the group size (integers: truncated toward zero); bool SUM/MAX/BOR
are logical or, PRODUCT/MIN/BAND logical and, BXOR exclusive or; integer
overflow wraps (two's complement). Float inputs are small integers, so any
summation order gives the same bits and X and Gloo compare bitwise; integer
SUM and PRODUCT inputs span the whole range, so they wrap. A few cases with
inexact float inputs ("values=inexact", reference only) are the ones that
see the rank order and the float32 accumulation.

Also covered: all_gather with a different size per rank, all_to_all(_single)
with uneven splits (some empty) and with ranks passing different forms of
splits (equal, uneven, none, all zero; a rank sending or receiving nothing), recv from any source (the reported sender is
checked), tag matching, non-contiguous tensors (a transposed one; strided
slices whose gaps must stay untouched), counts 0, 1, 1001 and 300000 (--quick:
float32 keeps them all, other dtypes use 7). Each rank prints one summary
line; the first mismatch raises AssertionError naming the op, dtype, reduce
op, group, mode and the first differing element; so does an error raised by X
(a hang too: the groups time out after --timeout seconds).
monitored_barrier is called as a ProcessGroup method: torch 2.13's own
dist.monitored_barrier() refuses every backend but Gloo (torchneuron replaces
it for neuron groups).

Gloo's gaps in torch 2.13 (CPU) are listed up front (GLOO_* below), not found
by trial: some of its failures hit one side only (a non-contiguous recv fails
while its send completes; so does a recv from any source of an empty tensor)
or are silently wrong (a strided broadcast or all_reduce), which would wreck
the run. Gloo's own outputs are checked against the reference too, and a Gloo
RuntimeError outside the table falls back to the reference and is reported.
With --backend gloo, X is Gloo as well: the cases Gloo lacks are skipped and
the ops in GLOO_BLOCKING_ONLY run blocking only.
"""
import argparse
import datetime
import os
import sys
import warnings
import zlib

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

warnings.filterwarnings("ignore", message=".*will be deprecated.*")

RANK = int(os.environ.get("RANK", "0"))
REDUCE_OPS = {"SUM": ReduceOp.SUM, "PRODUCT": ReduceOp.PRODUCT, "MIN": ReduceOp.MIN,
              "MAX": ReduceOp.MAX, "AVG": ReduceOp.AVG, "BAND": ReduceOp.BAND,
              "BOR": ReduceOp.BOR, "BXOR": ReduceOp.BXOR}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
REDUCE_DTYPES = FLOATS + INTS + [torch.bool]
MOVE_DTYPES = REDUCE_DTYPES + [torch.int16, torch.complex64]
LARGE = 300_000
NONCONTIG_SHAPE = (77, 13)  # 1001 elements
ROOTED = {"reduce", "broadcast", "gather", "scatter", "recv_any_source"}

REDUCTIONS = ["all_reduce", "all_reduce_coalesced", "reduce", "reduce_scatter",
              "reduce_scatter_tensor"]
MOVEMENT = ["broadcast", "all_gather", "all_gather_uneven", "all_gather_into_tensor",
            "all_gather_coalesced", "gather", "scatter", "all_to_all_single",
            "all_to_all_single_uneven", "all_to_all", "send_recv", "recv_any_source"]
# Each rank passing its own form of splits (issue 47); float32 and int64 only.
A2A_MIXES = ["all_to_all_single_mixed", "all_to_all_single_zeros", "all_to_all_mixed"]
NONCONTIG = [("all_reduce", "transposed"), ("all_reduce", "strided"), ("broadcast", "strided"),
             ("all_gather", "strided"), ("send_recv", "strided")]

# What Gloo lacks in torch 2.13 on CPU (found by probing every combination on
# groups of 2, 3 and 4 ranks).
GLOO_DTYPES = set(REDUCE_DTYPES)  # int16: "Invalid scalar type"
GLOO_LACKS = {"all_gather_uneven"}  # "invalid tensor size"
GLOO_COMPLEX = {"broadcast", "all_gather", "all_gather_into_tensor", "all_gather_coalesced",
                "scatter", "all_to_all", "all_to_all_single",
                "all_to_all_single_uneven"}  # torch views complex as real for these
# Right results, but an async Work's is_completed() stays False after wait():
GLOO_BLOCKING_ONLY = {"reduce_scatter", "reduce_scatter_tensor"}
X_ONLY = {"monitored_barrier"}  # not run on the Gloo group


def gloo_supports(c):
    if c.op in GLOO_LACKS or not c.exact:  # Gloo sums in another order
        return False
    if c.rop == "AVG" and c.dtype not in FLOATS:
        return False  # Gloo divides the sum in place: "result type Float can't be cast"
    if c.op in ("all_to_all", "all_to_all_mixed") and c.count > 0:
        return False  # the splits are uneven; Gloo wants equal sizes: "invalid tensor size"
    if c.count == 0 and c.op == "recv_any_source":
        return False  # enforce fail on the receiver only
    if c.layout == "strided" and c.op != "all_gather":
        return False  # recv rejects it; all_reduce overwrites its gaps; broadcast fills half
    if c.op in ("send_recv", "recv_any_source"):  # bytes of any dtype
        return True
    if c.op in ("barrier", "monitored_barrier"):
        return True
    if c.dtype == torch.complex64:
        return c.op in GLOO_COMPLEX
    return c.dtype in GLOO_DTYPES


def reduce_ops(dtype):
    ops = ["SUM", "PRODUCT", "MIN", "MAX"]
    if dtype != torch.bool:
        ops.append("AVG")
    if dtype == torch.bool or dtype in INTS:
        ops += ["BAND", "BOR", "BXOR"]
    return ops


def value_range(dtype, rop):
    """[lo, hi) of the integers an input holds; exact in every dtype."""
    if dtype == torch.bool:
        return 0, 2
    if dtype in INTS or dtype == torch.int16:
        if rop == "AVG":
            return (0, 6) if dtype == torch.uint8 else (-5, 6)
        info = torch.iinfo(dtype)  # the full range: SUM and PRODUCT wrap
        return info.min, info.max
    half = {"SUM": 6, "AVG": 6, "PRODUCT": 4, "MIN": 100, "MAX": 100}.get(rop, 1000)
    return -half + 1, half


def bits(t):
    """t as integers of the same width, so that comparing compares bits."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if t.is_floating_point():
        t = t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def reference_reduce(xs, rop):
    """Folds xs (in group-rank order) the way the backend under test must."""
    dtype = xs[0].dtype
    if dtype == torch.bool:
        f = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
             "PRODUCT": torch.logical_and, "MIN": torch.logical_and,
             "BAND": torch.logical_and, "BXOR": torch.logical_xor}[rop]
    else:
        f = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
             "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
             "BXOR": torch.bitwise_xor}[rop]
    acc_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = xs[0].to(acc_dtype)
    for x in xs[1:]:
        acc = f(acc, x.to(acc_dtype))
    if rop == "AVG":
        acc = acc / len(xs) if acc.is_floating_point() else torch.div(acc, len(xs),
                                                                      rounding_mode="trunc")
    return acc.to(dtype)


class Group:
    def __init__(self, members, backend, timeout):
        self.members = members
        self.n = len(members)
        self.me = members.index(RANK) if RANK in members else None
        self.gloo = dist.new_group(members, timeout=timeout, backend="gloo")
        self.x = dist.new_group(members, timeout=timeout, backend=backend)


class Case:
    """One operation x dtype x reduce op x count x layout on one group."""

    def __init__(self, stats, group, op, dtype=None, rop=None, count=0, layout="contiguous",
                 exact=True, seed=0):
        self.stats, self.group, self.op, self.dtype, self.rop = stats, group, op, dtype, rop
        self.count, self.layout, self.exact, self.seed = count, layout, exact, seed
        self.members, self.n, self.me = group.members, group.n, group.me
        self.root = zlib.crc32(self.key().encode()) % self.n
        self.mode = None
        self.guards = []

    def key(self, *extra):
        return "|".join(map(str, (self.seed, self.op, self.dtype, self.rop, self.count,
                                  self.layout, self.exact) + extra))

    def describe(self):
        return (f"op={self.op} dtype={str(self.dtype).replace('torch.', '')} "
                f"reduce_op={self.rop} group={self.members} mode={self.mode} "
                f"count={self.count} layout={self.layout}"
                + (f" root={self.members[self.root]}" if self.op in ROOTED else "")
                + ("" if self.exact else " values=inexact"))

    def input(self, grank, salt=0, numel=None):
        """The deterministic input of global rank grank (any rank can compute it)."""
        numel = self.count if numel is None else numel
        g = torch.Generator().manual_seed(zlib.crc32(self.key(grank, salt, numel).encode()))
        if not self.exact:  # rounding happens: the result depends on order and precision
            return (torch.randn(numel, generator=g, dtype=torch.float64) * 4).to(self.dtype)
        lo, hi = value_range(self.dtype, self.rop)
        x = torch.randint(lo, hi, (numel,), generator=g, dtype=torch.int64)
        if self.dtype == torch.complex64:
            y = torch.randint(lo, hi, (numel,), generator=g, dtype=torch.int64)
            return torch.complex(x.float(), y.float()) / 8
        if self.dtype.is_floating_point and self.rop is None:
            return (x.double() / 8).to(self.dtype)  # fractions, to move more bits
        return x.to(self.dtype)

    def reduce(self, xs):
        return reference_reduce(xs, self.rop)

    def output(self, numel):
        """A tensor for an op to write numel elements into: garbage-filled;
        for the strided layout a slice of a buffer whose gaps are checked later."""
        garbage = self.input(-1, salt=len(self.guards) + 1000, numel=numel)
        if self.layout != "strided":
            return garbage
        buf = torch.empty(2 * numel, dtype=self.dtype)
        buf[1::2] = self.input(-2, salt=len(self.guards), numel=numel)
        self.guards.append((buf[1::2], buf[1::2].clone()))
        out = buf[0::2]
        out.copy_(garbage)
        return out

    def inplace(self, x):
        """x in the case's layout, as the in-place buffer of an op."""
        if self.layout == "transposed":
            t = torch.empty(NONCONTIG_SHAPE[::-1], dtype=x.dtype).t()
            t.copy_(x.view(NONCONTIG_SHAPE))
            return t
        if self.layout == "strided":
            out = self.output(x.numel())
            out.copy_(x)
            return out
        return x.clone()

    def finish(self, work, async_op):
        """Waits for an async op and checks its Work (or Future) reports completion."""
        if not async_op:
            assert work is None, f"{self.describe()}: blocking call returned {work!r}"
            return
        assert work is not None, f"{self.describe()}: async_op=True returned None"
        if isinstance(work, torch._C.Future):  # the *_coalesced ops return a Future
            work.wait()
            assert work.done(), f"{self.describe()}: future not done after wait()"
            return
        work.wait()
        assert work.is_completed(), f"{self.describe()}: is_completed() False after wait()"
        assert work.is_success(), f"{self.describe()}: is_success() False after wait()"
        exc = work.exception()
        assert exc is None, f"{self.describe()}: exception() is {exc!r} after wait()"

    def check(self, got, want, source):
        """Bitwise comparison of two lists of tensors; raises on the first difference."""
        assert len(got) == len(want), f"{self.describe()}: {len(got)} outputs vs {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            where = f"{self.describe()}: output {i} vs {source}"
            assert g.dtype == w.dtype and g.shape == w.shape, (
                f"{where}: got {g.dtype} {tuple(g.shape)}, expected {w.dtype} {tuple(w.shape)}")
            gb, wb = bits(g).reshape(-1), bits(w).reshape(-1)
            if not torch.equal(gb, wb):
                k = int((gb != wb).nonzero()[0])
                raise AssertionError(f"{where}: first difference at flat index {k}: got "
                                     f"{g.reshape(-1)[k].item()!r}, expected "
                                     f"{w.reshape(-1)[k].item()!r}")
        self.stats["checks"] += 1

    def check_guards(self):
        for got, want in self.guards:
            self.check([got], [want], "the untouched gaps of a strided output")
        self.guards = []


# --- the operations: run(c, group, async_op) -> outputs, ref(c) -> expected ---

def run_all_reduce(c, g, a):
    t = c.inplace(c.input(RANK))
    c.finish(dist.all_reduce(t, op=REDUCE_OPS[c.rop], group=g, async_op=a), a)
    return [t]


def ref_all_reduce(c):
    want = c.reduce([c.input(m) for m in c.members])
    return [want.view(NONCONTIG_SHAPE) if c.layout == "transposed" else want]


def coalesced_sizes(c):
    return [c.count, 3, c.count // 2 + 1]


def run_all_reduce_coalesced(c, g, a):
    ts = [c.input(RANK, salt=i, numel=k) for i, k in enumerate(coalesced_sizes(c))]
    c.finish(dist.all_reduce_coalesced(ts, op=REDUCE_OPS[c.rop], group=g, async_op=a), a)
    return ts


def ref_all_reduce_coalesced(c):
    return [c.reduce([c.input(m, salt=i, numel=k) for m in c.members])
            for i, k in enumerate(coalesced_sizes(c))]


def run_reduce(c, g, a):
    t = c.input(RANK)
    c.finish(dist.reduce(t, c.members[c.root], op=REDUCE_OPS[c.rop], group=g, async_op=a), a)
    return [t] if c.me == c.root else []


def ref_reduce(c):
    return ref_all_reduce(c) if c.me == c.root else []


def run_reduce_scatter(c, g, a):
    out = c.output(c.count)
    ins = [c.input(RANK, salt=j) for j in range(c.n)]
    c.finish(dist.reduce_scatter(out, ins, op=REDUCE_OPS[c.rop], group=g, async_op=a), a)
    return [out]


def ref_reduce_scatter(c):
    return [c.reduce([c.input(m, salt=c.me) for m in c.members])]


def run_reduce_scatter_tensor(c, g, a):
    out = c.output(c.count)
    t = c.input(RANK, numel=c.count * c.n)
    c.finish(dist.reduce_scatter_tensor(out, t, op=REDUCE_OPS[c.rop], group=g, async_op=a), a)
    return [out]


def ref_reduce_scatter_tensor(c):
    lo = c.me * c.count
    return [c.reduce([c.input(m, numel=c.count * c.n)[lo:lo + c.count] for m in c.members])]


def run_broadcast(c, g, a):
    root = c.members[c.root]
    t = c.inplace(c.input(RANK) if RANK == root else c.input(-1, salt=7))
    c.finish(dist.broadcast(t, root, group=g, async_op=a), a)
    return [t]


def ref_broadcast(c):
    return [c.input(c.members[c.root])]


def run_all_gather(c, g, a):
    outs = [c.output(c.count) for _ in range(c.n)]
    c.finish(dist.all_gather(outs, c.input(RANK), group=g, async_op=a), a)
    return outs


def ref_all_gather(c):
    return [c.input(m) for m in c.members]


def run_all_gather_uneven(c, g, a):
    outs = [c.output(c.count + j) for j in range(c.n)]
    c.finish(dist.all_gather(outs, c.input(RANK, numel=c.count + c.me), group=g,
                             async_op=a), a)
    return outs


def ref_all_gather_uneven(c):
    return [c.input(m, numel=c.count + j) for j, m in enumerate(c.members)]


def run_all_gather_into_tensor(c, g, a):
    out = c.output(c.count * c.n)
    c.finish(dist.all_gather_into_tensor(out, c.input(RANK), group=g, async_op=a), a)
    return [out]


def ref_all_gather_into_tensor(c):
    return [torch.cat([c.input(m) for m in c.members])]


def run_all_gather_coalesced(c, g, a):
    sizes = coalesced_sizes(c)
    outs = [[c.output(k) for k in sizes] for _ in range(c.n)]
    ins = [c.input(RANK, salt=i, numel=k) for i, k in enumerate(sizes)]
    c.finish(dist.all_gather_coalesced(outs, ins, group=g, async_op=a), a)
    return [t for ts in outs for t in ts]


def ref_all_gather_coalesced(c):
    return [c.input(m, salt=i, numel=k) for m in c.members
            for i, k in enumerate(coalesced_sizes(c))]


def run_gather(c, g, a):
    root = c.members[c.root]
    outs = [c.output(c.count) for _ in range(c.n)] if RANK == root else None
    c.finish(dist.gather(c.input(RANK), outs, root, group=g, async_op=a), a)
    return outs or []


def ref_gather(c):
    return ref_all_gather(c) if c.me == c.root else []


def run_scatter(c, g, a):
    root = c.members[c.root]
    ins = [c.input(root, salt=j) for j in range(c.n)] if RANK == root else None
    out = c.output(c.count)
    c.finish(dist.scatter(out, ins, root, group=g, async_op=a), a)
    return [out]


def ref_scatter(c):
    return [c.input(c.members[c.root], salt=c.me)]


def split(c, src, dst):
    """Elements group rank src sends group rank dst in the uneven all-to-alls (0 included)."""
    return (c.count + 3 * src + 5 * dst) % 7 if c.count else 0


def run_all_to_all_single(c, g, a):
    out = c.output(c.count * c.n)
    c.finish(dist.all_to_all_single(out, c.input(RANK, numel=c.count * c.n), group=g,
                                    async_op=a), a)
    return [out]


def ref_all_to_all_single(c):
    k, lo = c.count, c.me * c.count
    return [torch.cat([c.input(m, numel=k * c.n)[lo:lo + k] for m in c.members])]


def mixed_split(c, src, dst):
    """The mix of issue 47, every rank passing its own form: group ranks 1 and 2 send
    and receive c.count everywhere (rank 1 says so in its splits, rank 2 passes none),
    the others uneven splits (some empty); count 0: every split is 0."""
    return c.count if {src, dst} & {1, 2} else split(c, src, dst)


def zeros_split(c, src, dst):
    """Group rank 0 passes all-zero splits; with 3 ranks or more the last sends
    nothing (but receives), with 4 or more rank 1 receives nothing (but sends)."""
    if 0 in (src, dst) or (c.n > 2 and src == c.n - 1) or (c.n > 3 and dst == 1):
        return 0
    return split(c, src, dst)


def a2a_splits(c, sizes):
    return [sizes(c, c.me, j) for j in range(c.n)], [sizes(c, j, c.me) for j in range(c.n)]


def run_a2a_single(c, g, a, sizes, no_splits=()):
    ins, outs = a2a_splits(c, sizes)
    out, inp = c.output(sum(outs)), c.input(RANK, numel=sum(ins))
    if c.me in no_splits:  # its blocks are equal: all_to_all_single splits evenly
        ins = outs = None
    c.finish(dist.all_to_all_single(out, inp, outs, ins, group=g, async_op=a), a)
    return [out]


def ref_a2a_single(c, sizes):
    chunks = []
    for j, m in enumerate(c.members):
        sent = [sizes(c, j, d) for d in range(c.n)]
        lo = sum(sent[:c.me])
        chunks.append(c.input(m, numel=sum(sent))[lo:lo + sent[c.me]])
    return [torch.cat(chunks)]


def run_all_to_all_single_uneven(c, g, a):
    return run_a2a_single(c, g, a, split)


def ref_all_to_all_single_uneven(c):
    return ref_a2a_single(c, split)


def run_all_to_all_single_mixed(c, g, a):
    return run_a2a_single(c, g, a, mixed_split, no_splits=(2,))


def ref_all_to_all_single_mixed(c):
    return ref_a2a_single(c, mixed_split)


def run_all_to_all_single_zeros(c, g, a):
    return run_a2a_single(c, g, a, zeros_split)


def ref_all_to_all_single_zeros(c):
    return ref_a2a_single(c, zeros_split)


def run_a2a_list(c, g, a, sizes):
    outs = [c.output(sizes(c, j, c.me)) for j in range(c.n)]
    ins = [c.input(RANK, salt=j, numel=sizes(c, c.me, j)) for j in range(c.n)]
    c.finish(dist.all_to_all(outs, ins, group=g, async_op=a), a)
    return outs


def ref_a2a_list(c, sizes):
    return [c.input(m, salt=c.me, numel=sizes(c, j, c.me)) for j, m in enumerate(c.members)]


def run_all_to_all(c, g, a):
    return run_a2a_list(c, g, a, split)


def ref_all_to_all(c):
    return ref_a2a_list(c, split)


def run_all_to_all_mixed(c, g, a):
    return run_a2a_list(c, g, a, mixed_split)


def ref_all_to_all_mixed(c):
    return ref_a2a_list(c, mixed_split)


def run_send_recv(c, g, a):
    """A ring: each member sends two tagged messages to the next and receives the
    previous one's; async receives post the second tag first (tag matching)."""
    nxt, prv = c.members[(c.me + 1) % c.n], c.members[(c.me - 1) % c.n]
    outs = [c.output(c.count) for _ in range(2)]
    sends = [c.input(RANK, salt=t) for t in range(2)]
    if a:
        works = [dist.isend(sends[t], nxt, group=g, tag=10 + t) for t in range(2)]
        works += [dist.irecv(outs[t], prv, group=g, tag=10 + t) for t in (1, 0)]
        for w in works:
            c.finish(w, True)
    else:  # even group ranks send first, odd ones receive first: no cycle of blocking sends
        for phase in ((0, 1) if c.me % 2 == 0 else (1, 0)):
            for t in range(2):
                if phase == 0:
                    dist.send(sends[t], nxt, group=g, tag=10 + t)
                else:
                    assert dist.recv(outs[t], prv, group=g, tag=10 + t) == prv
    return outs


def ref_send_recv(c):
    return [c.input(c.members[(c.me - 1) % c.n], salt=t) for t in range(2)]


def run_recv_any_source(c, g, a):
    """The root receives one message from every other member with src=None; the
    messages are returned in sender order, as reported by the calls."""
    root = c.members[c.root]
    if RANK != root:
        c.finish(dist.isend(c.input(RANK), root, group=g, tag=20) if a
                 else dist.send(c.input(RANK), root, group=g, tag=20), a)
        senders, outs = [], []
    else:
        outs = [c.output(c.count) for _ in range(c.n - 1)]
        if a:
            works = [dist.irecv(t, None, group=g, tag=20) for t in outs]
            for w in works:
                c.finish(w, True)
            senders = [c.members[w._source_rank()] for w in works]
        else:
            senders = [dist.recv(t, None, group=g, tag=20) for t in outs]
        others = [m for m in c.members if m != root]
        assert sorted(senders) == others, f"{c.describe()}: senders {senders}, expected {others}"
    # Only each sender's own order is guaranteed: without the barrier a receive could
    # rightly match a sender's message of the next run (same tag, same root).
    dist.barrier(group=g)
    return [t for _, t in sorted(zip(senders, outs), key=lambda st: st[0])]


def ref_recv_any_source(c):
    return [c.input(m) for m in c.members if m != c.members[c.root]] if c.me == c.root else []


def run_barrier(c, g, a):
    c.finish(dist.barrier(group=g, async_op=a), a)
    return []


def run_monitored_barrier(c, g, a):
    # torch 2.13's own dist.monitored_barrier() rejects every backend but Gloo in Python:
    # call the ProcessGroup's method, which a C++ backend can override.
    g.monitored_barrier(datetime.timedelta(seconds=60), wait_all_ranks=True)
    return []


def ref_nothing(c):
    return []


OPS = {name: (globals()["run_" + name], globals().get("ref_" + name, ref_nothing))
       for name in REDUCTIONS + MOVEMENT + A2A_MIXES + ["barrier", "monitored_barrier"]}


# --- the matrix ---

def cases(stats, group, quick, seed):
    def make(*args, **kw):
        return Case(stats, group, *args, seed=seed, **kw)

    def counts(dtype, rop):
        if dtype == torch.float32 and rop in (None, "SUM"):
            return [0, 1, 1001, LARGE]
        return [7] if quick else [0, 1, 1001]

    yield make("barrier")
    yield make("monitored_barrier")
    for op in REDUCTIONS:
        for dtype in REDUCE_DTYPES:
            for rop in reduce_ops(dtype):
                for count in counts(dtype, rop):
                    yield make(op, dtype, rop, count)
    for op in MOVEMENT:
        if op in ("send_recv", "recv_any_source") and group.n < 2:
            continue
        for dtype in MOVE_DTYPES:
            for count in counts(dtype, None):
                yield make(op, dtype, None, count)
    for op in A2A_MIXES:
        for dtype in (torch.float32, torch.int64):
            for count in counts(dtype, None):
                yield make(op, dtype, None, count)
    for op in REDUCTIONS:
        for dtype in FLOATS:
            for rop in ("SUM", "PRODUCT", "AVG"):
                yield make(op, dtype, rop, 1001, exact=False)
    for op, layout in NONCONTIG:
        if op == "send_recv" and group.n < 2:
            continue
        for dtype in (torch.float32, torch.int64):
            yield make(op, dtype, "SUM" if op == "all_reduce" else None, 1001, layout)


def run_case(c, group, backend, stats):
    run, ref = OPS[c.op]
    single_mode = c.op == "monitored_barrier" or (backend == "gloo" and c.op in GLOO_BLOCKING_ONLY)
    gloo_ok = gloo_supports(c)
    if backend == "gloo" and not gloo_ok:
        stats["skipped"] += 1
        return
    compare_gloo = gloo_ok and c.op not in X_ONLY
    want, gloo_out = ref(c), None
    if compare_gloo:
        c.mode = "gloo"
        try:
            gloo_out = run(c, group.gloo, False)
        except RuntimeError as e:  # a gap not in the table: fall back to the reference
            stats["gloo_rejected"].add(f"{c.op} {c.dtype} {c.rop}: {str(e).splitlines()[0]}")
            c.guards = []
        else:  # Gloo must agree with the reference too, or the table misses a gap
            c.check_guards()
            c.check(gloo_out, want, "the reference")
    for mode in ["sync"] if single_mode else ["sync", "async"]:
        c.mode = mode
        try:
            got = run(c, group.x, mode == "async")
        except RuntimeError as e:  # name the case (a timeout, an unsupported argument...)
            raise AssertionError(f"{c.describe()}: {type(e).__name__}: {e}") from e
        c.check_guards()
        c.check(got, want, "the reference")
        if gloo_out is not None:
            c.check(got, gloo_out, "gloo")
            stats["vs_gloo"] += 1
        else:
            stats["ref_only"] += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="neuron", help="backend under test (default neuron)")
    p.add_argument("--quick", action="store_true", help="fewer counts (under ~30 s at 4 ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120,
                   help="timeout of every group, seconds")
    args = p.parse_args()
    if args.backend == "neuron":
        import torchneuron  # noqa: F401  registers the "neuron" backend

    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    world = dist.get_world_size()
    assert world >= 2, "run with at least 2 ranks (4 is the norm)"
    shapes = []
    for s in (list(range(world)), list(range(0, world, 2)), list(range(1, world)), [world - 1]):
        if s not in shapes:
            shapes.append(s)
    groups = [Group(s, args.backend, timeout) for s in shapes]  # every rank, same order

    stats = {"checks": 0, "vs_gloo": 0, "ref_only": 0, "skipped": 0, "gloo_rejected": set()}
    for group in groups:
        if group.me is None:
            continue
        for c in cases(stats, group, args.quick, args.seed):
            run_case(c, group, args.backend, stats)

    for gap in sorted(stats["gloo_rejected"]):
        print(f"gloo rejected (not in the table): {gap}")
    skipped = f", {stats['skipped']} cases skipped (gloo lacks them)" if stats["skipped"] else ""
    print(f"c10d conformance, backend {args.backend}: {stats['checks']} checks passed; "
          f"{stats['vs_gloo'] + stats['ref_only']} runs compared: {stats['vs_gloo']} with gloo "
          f"and the reference, {stats['ref_only']} with the reference only{skipped}", flush=True)
    dist.barrier()
    dist.destroy_process_group()  # every group, X's too
    return 0


if __name__ == "__main__":
    sys.exit(main())
