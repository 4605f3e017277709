"""torchneuron.nki: kernels against their references, every hardware rule
named with the kernel's line, the list scheduler's timelines, a kernel as a
torch operator on "neuron" (eager, compiled, under autograd) and the
flash attention kernels' parity with scaled_dot_product_attention and its
gradient."""
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
import torchneuron.nki.isa as nisa  # noqa: E402
import torchneuron.nki.language as nl  # noqa: E402
from torchneuron import fabric  # noqa: E402
from torchneuron.nki.attention import (  # noqa: E402
    attention_lse_reference, flash_attention, flash_attention_lse)
from torchneuron.nki.attention_backward import flash_attention_backward  # noqa: E402
from torchneuron.nki.attention_op import attention  # noqa: E402

# Kernels compute on small tiles, where torch's intra-op threads only
# contend with the other test processes for the cores.
torch.set_num_threads(1)


def line_of(marker):
    """The line number of this file's line holding `marker`."""
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if marker in text and "line_of(" not in text:
                return number
    raise AssertionError(marker)


# ---- kernels ----------------------------------------------------------------

@nki.jit(reference=lambda a, b: a * 2 + b)
def axpy(a, b):
    """a * 2 + b over rows in tiles of 128."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(0, a.shape[0], 128):
        rows = slice(i, min(a.shape[0], i + 128))
        nl.store(out[rows, :], value=nl.add(nl.multiply(nl.load(a[rows, :]), 2.0),
                                            nl.load(b[rows, :])))
    return out


def matmul_reference(x, y):
    return (x.float() @ y.float()).to(x.dtype)


@nki.jit(reference=matmul_reference)
def matmul(x, y):
    """x [M, K] @ y [K, N], K accumulated over tiles of 128 in PSUM;
    M <= 128, N <= 512."""
    (m, k), n = x.shape, y.shape[1]
    out = nl.ndarray((m, n), dtype=x.dtype, buffer=nl.shared_hbm)
    acc = nl.zeros((m, n), dtype=nl.float32, buffer=nl.psum)
    for k0 in nl.affine_range(0, k, 128):
        x_t = nl.copy(nl.transpose(nl.load(x[:, k0:k0 + 128])))       # [K, M]
        acc += nisa.nc_matmul(x_t, nl.load(y[k0:k0 + 128, :]))
    nl.store(out, value=nl.copy(acc, dtype=x.dtype))
    return out


def test_kernels_match_their_references_over_shapes_and_dtypes():
    results = nki.check(axpy, shapes=[[(128, 64)] * 2, [(200, 33)] * 2],
                        dtypes=[torch.float32, torch.bfloat16])
    assert len(results) == 4 and all(r["time_us"] > 0 for r in results)
    assert results[0]["max_abs_error"] == 0.0
    results = nki.check(matmul, shapes=[[(128, 384), (384, 512)], [(64, 128), (128, 96)]],
                        dtypes=[torch.float32, torch.bfloat16])
    assert all(r["time_us"] > 0 for r in results)


def test_check_names_a_kernel_that_differs_from_its_reference():
    wrong = nki.Kernel(axpy.fn, reference=lambda a, b: a + b, name="wrong_axpy")
    with pytest.raises(AssertionError, match=r"kernel wrong_axpy output 0 differs .*"
                                             r"\[\(128, 8\), \(128, 8\)\], torch.float32"):
        nki.check(wrong, shapes=[[(128, 8), (128, 8)]])


# ---- the rules, each named with its line -------------------------------------

@nki.jit
def too_many_partitions(a):
    nl.load(a[0:256, :])  # rule: partitions


@nki.jit
def over_sbuf(a):
    tiles = []
    for _ in nl.affine_range(8):
        tiles.append(nl.ndarray((128, 8192), dtype=nl.float32))  # rule: sbuf (32 KiB each, 7 fit)


def test_over_sbuf_frees_rebound_tiles():
    @nki.jit
    def rebinding(a):
        for _ in nl.affine_range(8):
            t = nl.ndarray((128, 8192), dtype=nl.float32)  # the previous one is freed
        del t
        return nl.ndarray((1,), dtype=nl.float32, buffer=nl.shared_hbm)
    rebinding(torch.zeros(1))


@nki.jit
def over_psum(a):
    banks = [nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum) for _ in range(8)]
    banks.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum))  # rule: psum


@nki.jit
def over_a_bank(a):
    nl.zeros((128, 1024), dtype=nl.float32, buffer=nl.psum)  # rule: bank


@nki.jit
def wide_stationary(a):
    t = nl.load(a[0:128, 0:256])
    nisa.nc_matmul(t, t)  # rule: stationary


@nki.jit
def wide_moving(a):
    s, m = nl.load(a[0:128, 0:128]), nl.load(a[0:128, 0:1024])
    nisa.nc_matmul(s, m)  # rule: moving


@nki.jit
def contraction_mismatch(a):
    s, m = nl.load(a[0:128, 0:128]), nl.load(a[0:64, 0:128])
    nisa.nc_matmul(s, m)  # rule: contraction


@nki.jit
def matmul_from_psum(a):
    t = nl.load(a[0:128, 0:128])
    nisa.nc_matmul(nisa.nc_matmul(t, t), t)  # rule: psum operand


@nki.jit
def unwritten_read(a):
    t = nl.ndarray((128, 4), dtype=nl.float32)
    t[:, 0:2] = nl.load(a[0:128, 0:2])
    nl.exp(t)  # rule: unwritten


RULES = [
    (too_many_partitions, "rule: partitions",
     r"256 partitions: the partition dimension .* at most 128"),
    (over_sbuf, "rule: sbuf",
     r"SBUF over capacity: .* on top of 229376 live bytes per partition exceeds the 229376"),
    (over_psum, "rule: psum",
     r"PSUM over capacity: .* 16384 live bytes per partition exceeds the 16384"),
    (over_a_bank, "rule: bank", r"a PSUM tile fits one bank \(2048 bytes per partition"),
    (wide_stationary, "rule: stationary", r"stationary free size 256 .* at most 128"),
    (wide_moving, "rule: moving", r"moving free size 1024 .* at most 512"),
    (contraction_mismatch, "rule: contraction", r"differ in the partition \(contraction\)"),
    (matmul_from_psum, "rule: psum operand",
     r"stationary is a PSUM tile: the tensor engine reads SBUF"),
    (unwritten_read, "rule: unwritten",
     r"nl.exp reads a SBUF tile of shape \(128, 4\) with 256 unwritten"),
]


@pytest.mark.parametrize("kernel,marker,message", RULES, ids=[r[1] for r in RULES])
def test_every_rule_violation_names_the_kernels_line(kernel, marker, message):
    with pytest.raises(nki.KernelError, match=message) as info:
        kernel(torch.zeros(256, 1024))
    where = f"nki kernel {kernel.name}, test_nki.py:{line_of(marker)}:"
    assert str(info.value).startswith(where), str(info.value)
    assert marker in str(info.value)                 # the statement's own text
    assert info.value.line == (__file__, line_of(marker))
    assert isinstance(info.value, torchneuron.InvalidUsageError)


# ---- the schedule -------------------------------------------------------------

def test_engines_run_in_parallel_and_wait_for_their_inputs():
    run = axpy.run(torch.randn(512, 64), torch.randn(512, 64))
    lines = run.timelines()
    assert set(lines) == {"dma", "vector"}
    ends = {}
    for i in run.instructions:  # program order: load a, load b, multiply, add, store
        ends.setdefault(i.name, []).append(i)
    first_load, first_multiply = ends["load"][0], ends["multiply"][0]
    assert first_multiply.start_us == pytest.approx(first_load.end_us)  # waits for its input
    # The second tile's loads move while the first tile's vector work runs.
    assert ends["load"][2].start_us < ends["add"][0].end_us
    busy = run.busy_us()
    assert run.time_us < busy["dma"] + busy["vector"]
    assert run.time_us == pytest.approx(max(i.end_us for i in run.instructions))


@nki.jit(reference=matmul_reference)
def matmul_untransposed(x, y):
    """nl.matmul(x, y) with x [M, K] as stored: transposed by the language."""
    out = nl.ndarray((x.shape[0], y.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.copy(nl.matmul(nl.load(x), nl.load(y)), dtype=x.dtype))
    return out


def test_nl_matmul_transposes_its_first_operand_on_the_tensor_engine(tmp_path):
    nki.check(matmul_untransposed, shapes=[[(96, 128), (128, 200)]])
    run = matmul_untransposed.run(torch.randn(96, 128), torch.randn(128, 200))
    assert [i.name for i in run.timelines()["tensor"]] == ["nc_transpose", "nc_matmul"]
    path = tmp_path / "kernel.json"
    run.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["tid"] for e in events} == set(run.timelines())
    assert [e["name"] for e in events if e["tid"] == "tensor"] == ["nc_transpose", "nc_matmul"]
    assert all(e["args"]["line"].startswith("test_nki.py:") for e in events)


def test_a_matmul_is_priced_by_the_tensor_engine_model():
    run = matmul.run(torch.randn(128, 128, dtype=torch.bfloat16),
                     torch.randn(128, 512, dtype=torch.bfloat16))
    (mm,) = [i for i in run.instructions if i.name == "nc_matmul"]
    assert mm.engine == "tensor"
    assert mm.duration_us == pytest.approx(512 / 2.4e3)  # max(N, 64) cycles at 2.4 GHz
    assert run.peak_psum_bytes == 2 * 512 * 4  # the accumulator and one matmul result


# ---- as a torch operator on "neuron" -----------------------------------------

@nki.jit(reference=lambda a, b: a * b)
def multiply(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(a), nl.load(b)))
    return out


multiply_op = nki.as_op(multiply, "nki_test::multiply")


def _multiply_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _multiply_backward(ctx, grad):
    a, b = ctx.saved_tensors
    return multiply_op(grad, b), multiply_op(grad, a)


multiply_op.register_autograd(_multiply_backward, setup_context=_multiply_setup)


def test_a_kernel_op_runs_eagerly_on_neuron_and_charges_its_modelled_time():
    a, b = torch.randn(128, 32), torch.randn(128, 32)
    an, bn = a.to("neuron"), b.to("neuron")
    expected_us = multiply.run(a, b).time_us
    fabric.reset_eager()
    before = fabric.clock()["charged_us"]
    out = torch.ops.nki_test.multiply(an, bn)
    assert fabric.clock()["charged_us"] - before == pytest.approx(expected_us)
    records = fabric.eager_records()
    assert out.device.type == "neuron"
    assert torch.equal(out.cpu(), a * b)
    kernels = [r for r in records if r["kind"] == "nki"]
    assert [r["op"] for r in kernels] == ["nki::multiply"]
    assert kernels[0]["modelled_us"] == pytest.approx(expected_us)
    assert kernels[0]["bytes"] == 3 * 128 * 32 * 4
    assert all(r["modelled_us"] == 0 for r in records if r["kind"] != "nki")


def test_a_kernel_op_under_autograd_uses_the_backward_kernel():
    a = torch.randn(128, 16).to("neuron").requires_grad_()
    b = torch.randn(128, 16).to("neuron").requires_grad_()
    fabric.reset_eager()
    multiply_op(a, b).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), b.detach().cpu())
    torch.testing.assert_close(b.grad.cpu(), a.detach().cpu())
    ops = [r["op"] for r in fabric.eager_records() if r["kind"] == "nki"]
    assert ops == ["nki::multiply"] * 3  # forward, then one per input's gradient


# A kernel operator in a compiled graph: tests/python/test_nki_graphs.py.


# ---- flash attention ----------------------------------------------------------

ATTENTION_SHAPES = [[(1, 2, 256, 64)] * 3, [(2, 1, 200, 32)] * 3]  # S = 2 tiles, and 1.6
LONG = [[(1, 1, 640, 32)] * 3]  # key blocks of 512 and 128: the running rescale


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_scaled_dot_product_attention(causal):
    results = nki.check(flash_attention, shapes=ATTENTION_SHAPES + LONG,
                        dtypes=[torch.float32, torch.bfloat16], causal=causal)
    assert all(r["time_us"] > 0 for r in results)
    assert results[0]["max_abs_error"] < 1e-5
    nki.check(flash_attention_lse, shapes=ATTENTION_SHAPES[1:], causal=causal)


def _backward_inputs(causal):
    def make(shapes, dtype, gen):
        q, k, v, dout = (torch.randn(shapes[0], generator=gen).to(dtype) for _ in range(4))
        out, lse = attention_lse_reference(q, k, v, causal)
        return [q, k, v, out, dout, lse]
    return make


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_backward_matches_autograd(causal):
    results = nki.check(flash_attention_backward, shapes=[[s[0]] for s in ATTENTION_SHAPES],
                        dtypes=[torch.float32, torch.bfloat16],
                        make_inputs=_backward_inputs(causal), causal=causal)
    assert results[0]["max_abs_error"] < 1e-5


def test_flash_attention_op_on_neuron_and_its_gradient_by_the_backward_kernel():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 32) for _ in range(3))
    leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    fabric.reset_eager()
    out = attention(*leaves, causal=True)
    assert out.device.type == "neuron"
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*ref_leaves, is_causal=True)
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(expected)
    out.backward(grad.to("neuron"))
    expected.backward(grad)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)
    kernels = [r["op"] for r in fabric.eager_records() if r["kind"] == "nki"]
    assert kernels == ["nki::flash_attention_lse", "nki::flash_attention_backward"]
    kernels = [r["op"] for r in fabric.eager_records() if r["kind"] == "nki"]
    assert kernels == ["nki::flash_attention_lse", "nki::flash_attention_backward"]


def test_flash_attention_in_a_compiled_graph_forward_and_backward():
    """Compiled on "neuron" tensors: each kernel operator is a node of its
    graph's plan (their fake shapes let Dynamo and AOTAutograd trace them),
    no split and no eager kernel run; results and gradients those of
    scaled_dot_product_attention."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 32) for _ in range(3))
    leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    f = torch.compile(lambda a, b, c: attention(a, b, c, causal=True) * 2, backend="neuron")
    fabric.reset_eager()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(*leaves)
        out.sum().backward()
    assert not [str(w.message) for w in caught if "on the CPU" in str(w.message)]
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = torch.nn.functional.scaled_dot_product_attention(*ref_leaves, is_causal=True) * 2
    expected.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), expected.detach(), rtol=1e-5, atol=1e-5)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)
    assert out.device.type == "neuron"
    assert not [r for r in fabric.eager_records() if r["kind"] == "nki"]  # in the plans
    rows = torchneuron.compiler.metrics()[-2:]
    assert [[k["op"] for k in r["kernels"]] for r in rows] == [
        ["nki::flash_attention_forward"], ["nki::flash_attention_backward"]]
