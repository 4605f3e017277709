"""torchneuron.nki kernels inside torch.compile(backend="neuron") graphs:
the kernel operator is one node of the compiled plan (no split, no
fallback, fullgraph accepted), its results are the kernel's, the plan's
modelled time is its other instructions' plus the kernel's own schedule,
a changed kernel recompiles, autograd runs the backward kernel in the
backward graph, and a kernel returning other shapes than traced is named."""
import json
import os
import sys
import warnings

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torchneuron  # noqa: E402
import torchneuron.nki as nki  # noqa: E402
import torchneuron.nki.language as nl  # noqa: E402
from torchneuron import fabric  # noqa: E402
from torchneuron.nki.attention_op import attention  # noqa: E402

torch.set_num_threads(1)


def _scale_add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.multiply(nl.load(a), 2.0), nl.load(b)))
    return out


def _scale_sub(a, b):  # the "edited" kernel: another source, another result
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.subtract(nl.multiply(nl.load(a), 2.0), nl.load(b)))
    return out


scale_add = nki.jit(_scale_add, reference=lambda a, b: a * 2 + b, name="scale_add")
scale_add_op = nki.as_op(scale_add, "nki_graph_test::scale_add")


def f(x, y):
    """relu on the device, the kernel on its result (stored to HBM for it),
    then * 3 on the kernel's result (loaded back): a chain."""
    return torch.ops.nki_graph_test.scale_add(x.relu(), y) * 3


def _row(name_prefix):
    rows = [r for r in torchneuron.compiler.metrics() if r["name"].startswith(name_prefix)]
    assert rows, name_prefix
    return rows[-1]


def _compile_and_run(x, y):
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CPU segment, no fallback warning
        return torch.compile(f, backend="neuron", fullgraph=True)(x, y)


def test_a_kernel_op_is_one_node_of_the_compiled_plan_priced_by_its_schedule(tmp_path):
    x, y = torch.randn(128, 64), torch.randn(128, 64)
    out = _compile_and_run(x, y)
    assert torch.equal(out, f(x, y))  # eager: the operator runs the kernel too
    row = _row("f_")
    assert row["compiled"] and row["fallback_ops"] == {} and "segments" not in row
    kernel_us = scale_add.run(x.relu(), y).time_us
    (k,) = row["kernels"]
    assert k["op"] == "nki_graph_test::scale_add" and k["kernel"] == "scale_add"
    assert k["time_us"] == pytest.approx(kernel_us)
    assert set(k["busy_us"]) == {"dma", "vector"}
    path = tmp_path / "plan.json"
    torchneuron.compiler.export_timeline(str(path), row["name"])
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
    kernel = [e for e in events if e["name"].startswith("nki_graph_test::scale_add@")]
    # One instruction, shown on each engine it holds, for the kernel's own time.
    assert len({e["name"] for e in kernel}) == 1
    assert {e["tid"] for e in kernel} == {1, 4}  # vector, dma (plan_timing's Engine order)
    # (The trace prints 6 significant digits.)
    assert all(e["dur"] == pytest.approx(kernel_us, rel=1e-5) for e in kernel)
    # A chain: the plan lasts its other instructions plus the kernel.
    others = {e["name"]: e["dur"] for e in events if e not in kernel}
    assert len(others) >= 5  # load x, relu, store for the kernel, load its result, * 3, store
    assert row["modelled_us"] == pytest.approx(sum(others.values()) + kernel_us, rel=1e-5)
    assert row["modelled_us"] == pytest.approx(max(e["ts"] + e["dur"] for e in events),
                                               rel=1e-5)
    # The profile's view of the run (fabric.graph_runs, export_chrome_trace).
    run = [r for r in fabric.graph_runs() if r["name"] == row["name"]][-1]
    on = {engine for engine, op, _, _ in run["engines"] if op.startswith("nki_graph_test::")}
    assert on == {"vector", "dma"}


def test_a_changed_kernel_recompiles_and_runs_its_new_source():
    x, y = torch.randn(128, 32), torch.randn(128, 32)
    _compile_and_run(x, y)
    _compile_and_run(x, y)
    same = _row("f_")
    assert same["cache"] == "memory hit"  # the same kernel: the same key
    original = scale_add.fn
    try:
        scale_add.fn = _scale_sub
        out = _compile_and_run(x, y)
        row = _row("f_")
    finally:
        scale_add.fn = original
    # Another key: compiled here, or found on disk from an earlier run of it.
    assert row["graph_id"] != same["graph_id"] and row["cache"] != "memory hit"
    assert torch.equal(out, (x.relu() * 2 - y) * 3)


def test_the_attention_kernels_forward_and_backward_in_compiled_graphs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 128, 32) for _ in range(3))

    def loss(q, k, v):
        o = attention(q * 0.5, k, v, causal=True)
        return (o * o).sum()

    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    loss(*eager).backward()
    torch._dynamo.reset()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = torch.compile(loss, backend="neuron", fullgraph=True)(*leaves)
        value.backward()
    torch.testing.assert_close(value, loss(q, k, v), rtol=1e-6, atol=1e-5)
    for a, b in zip(leaves, eager):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    rows = [r for r in torchneuron.compiler.metrics() if r["name"].startswith("loss_")]
    kernels = {k["op"] for r in rows for k in r.get("kernels", [])}
    assert kernels == {"nki::flash_attention_forward", "nki::flash_attention_backward"}
    assert all(r["compiled"] and not r["fallback_ops"] for r in rows)


def _half_rows(a):
    out = nl.ndarray((a.shape[0] // 2, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.load(a[:a.shape[0] // 2, :])))
    return out


# Its fake says the result has a's shape; the kernel returns half of it.
half_rows_op = nki.as_op(nki.jit(_half_rows), "nki_graph_test::half_rows",
                         fake=lambda a: torch.empty_like(a))


def test_a_kernel_returning_other_shapes_than_traced_is_an_error_naming_it():
    torch._dynamo.reset()
    f = torch.compile(lambda a: torch.ops.nki_graph_test.half_rows(a) + 1, backend="neuron",
                      fullgraph=True)
    with pytest.raises(torchneuron.InvalidUsageError,
                       match=r"nki kernel nki_graph_test::half_rows@\w+ in a compiled "
                             r"graph: output 0 is .*\[4, 8\], the graph traced .*\[8, 8\]"):
        f(torch.randn(8, 8))


def test_kernels_of_one_source_with_other_captured_values_have_other_keys():
    from torchneuron.nki.graph_kernel import source_digest

    def make(c):
        def scaled(a):
            out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
            nl.store(out, value=nl.multiply(nl.load(a), c))
            return out
        return nki.jit(scaled, reference=lambda a: a * c, name="scaled")

    assert source_digest(make(2.0)) == source_digest(make(2.0))
    assert source_digest(make(2.0)) != source_digest(make(3.0))
