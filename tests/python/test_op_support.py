"""The device's op support table on "neuron" (runtime/device/op_support.h,
docs/operators.md): each category on real ops, and the types the NeuronCore
lacks (docs/device.md)."""
import os
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
os.environ.pop("LOCAL_RANK", None)

import torch  # noqa: E402

import torchneuron  # noqa: E402,F401  (registers the device)
from torchneuron import fabric  # noqa: E402


def _fallback_us(bytes_total, elements):
    # Two copies over the host link (2 us each plus bytes at 32 GB/s), the
    # CPU's kernel at 1 ns an element, 5 us of synchronisation: the device
    # spec's host defaults.
    return 2 * 2 + bytes_total / 32e3 + elements / 1e3 + 5


def _records(fn):
    fabric.reset_eager()
    before = fabric.clock()["compute_us"]
    fn()
    records = fabric.eager_records()
    assert fabric.clock()["compute_us"] - before == pytest.approx(
        sum(r["modelled_us"] for r in records))
    return records


def test_a_native_op_runs_on_its_engine():
    a = torch.randn(64, 64, device="neuron")
    (mm,) = _records(lambda: a @ a)
    assert (mm["op"], mm["kind"]) == ("aten::mm", "matmul")


def test_sort_unique_and_nonzero_are_cpu_fallbacks_priced_with_the_copies():
    x = torch.randn(1000, device="neuron")
    records = _records(lambda: (torch.sort(x), torch.unique(x), torch.nonzero(x)))
    by_op = {r["op"]: r for r in records}
    # sort: 1000 floats in; values and int64 indices out (2000 elements).
    sort = by_op["aten::sort.stable"]
    assert sort["kind"] == "fallback" and sort["bytes"] == 4000 + 4000 + 8000
    assert sort["modelled_us"] == pytest.approx(_fallback_us(16000, 2000))
    unique = by_op["aten::_unique2"]
    assert unique["kind"] == "fallback"
    assert unique["modelled_us"] == pytest.approx(_fallback_us(8000, 1000))
    nonzero = by_op["aten::nonzero"]  # randn has no zeros: 1000 x 1 int64 out
    assert nonzero["kind"] == "fallback"
    assert nonzero["modelled_us"] == pytest.approx(_fallback_us(4000 + 8000, 1000))


def test_an_unsupported_op_is_an_error_naming_it_and_why():
    x = torch.randn(8, device="neuron")
    with pytest.raises(NotImplementedError, match=r"'aten::quantize_per_tensor' is not "
                       r"supported on the neuron device: quantized tensors"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.quint8)


def test_metadata_ops_cost_nothing():
    x = torch.randn(4, 6, device="neuron")
    records = _records(lambda: (x.view(6, 4), x.t(), x.unsqueeze(0), x.split(2, dim=1),
                                x.unbind(0), x.narrow(1, 0, 3), x.expand(2, 4, 6),
                                x.as_strided((2, 2), (1, 1)), x.diagonal(), x.detach()))
    assert records == []


def test_float64_is_a_cpu_fallback_never_an_fp32_op():
    d = torch.randn(64, 64, dtype=torch.float64, device="neuron")
    f = d.float()
    (mm64,) = _records(lambda: d @ d)
    (mm32,) = _records(lambda: f @ f)
    assert mm32["kind"] == "matmul"
    assert mm64["kind"] == "fallback"
    assert mm64["modelled_us"] == pytest.approx(_fallback_us(3 * 64 * 64 * 8, 64 * 64))
    assert torch.equal((d @ d).cpu(), d.cpu() @ d.cpu())  # the CPU's float64 result


def test_complex_types_are_refused_with_neurons_message():
    x = torch.randn(4, 2, device="neuron")
    c = torch.view_as_complex(x)  # metadata: allowed
    assert c.dtype == torch.complex64
    with pytest.raises(RuntimeError, match=r"aten::mul.Tensor on a ComplexFloat tensor of the "
                       r"neuron device: Complex data types are not supported on the Neuron "
                       r"device \(NCC_EVRF004\)"):
        c * c
    with pytest.raises(NotImplementedError, match=r"aten::_fft_r2c.*NCC_EVRF004"):
        torch.fft.rfft(x[:, 0])


def test_a_compiled_graph_with_an_unsupported_op_is_an_error_not_a_cpu_segment():
    x = torch.randn(16, device="neuron")
    f = torch.compile(lambda x: torch.fft.rfft(x * 2).abs(), backend="neuron")
    with pytest.raises(Exception, match=r"aten._fft_r2c \(File .*test_op_support.py.*\) is not "
                       r"supported on the device: Complex data types are not supported on the "
                       r"Neuron device \(NCC_EVRF004\)"):
        f(x)


def test_fnuz_float8_is_refused_with_neurons_message():
    x = torch.randn(8, device="neuron").to(torch.float8_e4m3fnuz)  # copies convert: allowed
    assert torch.equal(x.float().cpu(), x.cpu().float())
    with pytest.raises(RuntimeError, match=r"aten::neg on a Float8_e4m3fnuz tensor of the neuron "
                       r"device: .*F8E4M3FNUZ.*NCC_EVRF005.*convert it to a supported type"):
        torch.neg(x)
