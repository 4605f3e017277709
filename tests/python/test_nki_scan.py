"""The selective scan kernel (torchneuron.nki.selective_scan) against the
scan of torchneuron.models.ssm and the backward kernel against autograd
through it, over shapes and dtypes; the operator on "neuron" eagerly,
under autograd and in compiled graphs; the vector engine's scan
instruction they are built on (nisa.tensor_tensor_scan) and its operand
rule."""
import os
import sys

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))

import pytest  # noqa: E402
import torch  # noqa: E402

import torchneuron  # noqa: E402
import torchneuron.nki as nki  # noqa: E402
import torchneuron.nki.isa as nisa  # noqa: E402
import torchneuron.nki.language as nl  # noqa: E402
from torchneuron import fabric  # noqa: E402
from torchneuron.models.ssm import selective_scan as model_scan  # noqa: E402
from torchneuron.nki.selective_scan import selective_scan  # noqa: E402
from torchneuron.nki.selective_scan_backward import selective_scan_backward  # noqa: E402
from torchneuron.nki.selective_scan_op import selective_scan as scan_op  # noqa: E402

torch.set_num_threads(1)

# torch.testing.assert_close's defaults (/work/shared/REFERENCE.md).
DEFAULT_TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def scan_inputs(shapes, dtype, gen):
    """x, delta, A, B, C as the model makes them: delta in (0, 1), A >= 1."""
    (batch, seq, inner), state = shapes[0], shapes[3][2]
    x = torch.randn(batch, seq, inner, generator=gen)
    delta = torch.rand(batch, seq, inner, generator=gen)
    A = 1 + 3 * torch.rand(inner, generator=gen)
    B = torch.randn(batch, seq, state, generator=gen)
    C = torch.randn(batch, seq, state, generator=gen)
    return [v.to(dtype) for v in (x, delta, A, B, C)]


def scan_shapes(batch, seq, inner, state):
    return [(batch, seq, inner), (batch, seq, inner), (inner,), (batch, seq, state),
            (batch, seq, state)]


def test_the_kernel_matches_the_models_scan_over_shapes_and_dtypes():
    """130 channels: a full and a partial tile of partitions; T = 520: two
    chunks of time, the second starting from the first's last state."""
    results = nki.check(selective_scan,
                        shapes=[scan_shapes(2, 40, 130, 4), scan_shapes(1, 520, 8, 2)],
                        dtypes=[torch.float32, torch.bfloat16], make_inputs=scan_inputs,
                        tolerances=DEFAULT_TOLERANCES)
    assert len(results) == 4 and all(r["time_us"] > 0 for r in results)


def test_the_engines_share_the_scan():
    x, delta, A, B, C = scan_inputs(scan_shapes(1, 256, 128, 8), torch.float32,
                                    torch.Generator().manual_seed(0))
    run = selective_scan.run(x, delta, A, B, C)
    busy = run.busy_us()
    assert set(busy) == {"dma", "tensor", "vector", "scalar", "gpsimd"}
    names = {i.name for i in run.timelines()["vector"]}
    assert "tensor_tensor_scan" in names
    # One scan per state and chunk, the engines overlapping.
    assert sum(i.name == "tensor_tensor_scan" for i in run.instructions) == 8
    assert run.time_us < 0.7 * sum(busy.values()), (run.time_us, busy)


def test_the_operator_on_neuron_equals_the_models_scan_and_charges_the_kernel():
    x, delta, A, B, C = scan_inputs(scan_shapes(2, 24, 40, 4), torch.float32,
                                    torch.Generator().manual_seed(1))
    args = [v.to("neuron") for v in (x, delta, A, B, C)]
    mask = torch.ones(24, 24, dtype=torch.bool).triu(1)
    expected_us = selective_scan.run(x, delta, A, B, C).time_us
    fabric.reset_eager()
    before = fabric.clock()["charged_us"]
    y = scan_op(*args)
    assert fabric.clock()["charged_us"] - before == pytest.approx(expected_us)
    assert y.device.type == "neuron"
    assert [r["op"] for r in fabric.eager_records()] == ["nki::selective_scan"]
    torch.testing.assert_close(y.cpu(), model_scan(*args, mask.to("neuron")).cpu())


def test_the_backward_kernel_matches_autograd_through_the_models_scan():
    """T = 257: chunks of 128 taken from the last, which is one step."""
    def with_dy(shapes, dtype, gen):
        return scan_inputs(shapes, dtype, gen) + [torch.randn(shapes[0], generator=gen).to(dtype)]
    results = nki.check(selective_scan_backward,
                        shapes=[scan_shapes(2, 40, 130, 4) + [(2, 40, 130)],
                                scan_shapes(1, 257, 8, 2) + [(1, 257, 8)]],
                        dtypes=[torch.float32, torch.bfloat16], make_inputs=with_dy,
                        tolerances=DEFAULT_TOLERANCES)
    assert len(results) == 4


def test_the_operators_gradient_on_neuron_is_the_backward_kernel():
    x, delta, A, B, C = scan_inputs(scan_shapes(2, 24, 40, 4), torch.float32,
                                    torch.Generator().manual_seed(2))
    dy = torch.randn(2, 24, 40)
    mask = torch.ones(24, 24, dtype=torch.bool).triu(1).to("neuron")
    leaves = [[v.to("neuron").requires_grad_() for v in (x, delta, A, B, C)]
              for _ in range(2)]
    fabric.reset_eager()
    scan_op(*leaves[0]).backward(dy.to("neuron"))
    ops = [r["op"] for r in fabric.eager_records() if r["kind"] == "nki"]
    assert ops == ["nki::selective_scan", "nki::selective_scan_backward"]
    model_scan(*leaves[1], mask).backward(dy.to("neuron"))
    # float32 both, summed in other orders (the closed form's cumsum of
    # log-decays against the recurrence): nki.check's float32 tolerance.
    rtol, atol = nki.checks.TOLERANCES[torch.float32]
    for name, got, want in zip(("x", "delta", "A", "B", "C"), *leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad.cpu(), rtol=rtol, atol=atol,
                                   msg=name)


def test_the_operator_in_a_compiled_graph_forward_and_backward_equals_eager():
    """One node of each compiled graph (fullgraph: no split), priced by the
    kernels' schedules."""
    def f(x, delta, A, B, C):
        return scan_op(x, torch.sigmoid(delta), A, B, C) * 2

    inputs = scan_inputs(scan_shapes(2, 24, 40, 4), torch.float32,
                         torch.Generator().manual_seed(3))
    leaves = [[v.to("neuron").requires_grad_() for v in inputs] for _ in range(2)]
    torch._dynamo.reset()
    out = torch.compile(f, backend="neuron", fullgraph=True)(*leaves[0])
    out.sum().backward()
    expected = f(*leaves[1])
    expected.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach().cpu())
    for got, want in zip(*leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad.cpu())
    rows = [r for r in torchneuron.compiler.metrics() if r["name"].startswith("f_")][-2:]
    assert [[k["op"] for k in r["kernels"]] for r in rows] == [
        ["nki::selective_scan"], ["nki::selective_scan_backward"]]


# ---- the scan instruction -------------------------------------------------------

@nki.jit
def running(a, b, start):
    """tensor_tensor_scan(a, b, start) with op0 subtract, op1 multiply."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.tensor_tensor_scan(nl.load(a), nl.load(b), nl.load(start),
                                                nl.subtract, nl.multiply))
    return out


def test_the_scan_instruction_walks_the_free_dimension_in_nkis_operand_order():
    a, b, start = torch.randn(16, 9), torch.randn(16, 9), torch.randn(16, 1)
    prev, expected = start[:, 0], []
    for i in range(9):
        prev = (a[:, i] - prev) * b[:, i]     # op1(op0(data0, previous), data1)
        expected.append(prev)
    torch.testing.assert_close(running(a, b, start), torch.stack(expected, 1))


@nki.jit
def scan_of_psum(a):
    t = nl.load(a[0:128, 0:128])
    p = nisa.nc_matmul(t, t)
    nisa.tensor_tensor_scan(p, nisa.nc_matmul(t, t), 0.0, nl.multiply, nl.add)  # both PSUM


def test_a_scan_of_two_psum_tiles_is_refused_at_its_line():
    with pytest.raises(nki.KernelError, match=r"both PSUM tiles") as info:
        scan_of_psum(torch.zeros(128, 128))
    assert info.value.line[0] == __file__
    with open(__file__, encoding="utf-8") as f:
        assert "# both PSUM" in f.readlines()[info.value.line[1] - 1]
