"""Scans on "neuron": cumsum (forward, and its flip/cumsum/flip gradient)
compiled with torch.compile(backend="neuron") stays on the device and
equals eager CPU bitwise; the Mamba-style selective-scan model
(torchneuron.models.ssm) on "neuron", eager and compiled, against eager
CPU (loss and every gradient)."""
import copy
import os
import subprocess
import sys

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))

import torch  # noqa: E402

import torchneuron  # noqa: E402
from torchneuron import fabric  # noqa: E402
from torchneuron.models.ssm import SSMLM, SSMConfig, selective_scan  # noqa: E402


def rows_named(prefix):
    return [r for r in torchneuron.compiler.metrics() if r["name"].startswith(prefix)]


def test_a_compiled_cumsum_and_its_gradient_stay_on_the_device_and_equal_eager():
    def scans(x, w):
        inner = torch.cumsum(x * w, dim=1)         # along a middle dim
        return torch.cumsum(inner, dim=-1)         # and the last

    torch.manual_seed(0)
    x = torch.randn(3, 40, 5)
    w = torch.randn(5, requires_grad=True)
    xc, wc = x.clone(), w.detach().clone().requires_grad_()
    # fullgraph: a CPU segment would be an error, not a fallback.
    out = torch.compile(scans, backend="neuron", fullgraph=True)(x, w)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    expected = scans(xc, wc)
    expected.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    assert torch.equal(out, expected)  # summed in the same order, in double
    torch.testing.assert_close(w.grad, wc.grad, rtol=1e-5, atol=1e-5)  # a sum over rows
    rows = rows_named("scans")
    assert {r["name"].rsplit("_", 1)[1] for r in rows[-2:]} == {"forward", "backward"}
    for r in rows[-2:]:
        assert r["compiled"] and not r["fallback_ops"] and not r.get("segments"), r
        assert r["modelled_us"] > 0 and r["engine_us"]["vector"] > 0


def charged(f, *args):
    before = fabric.clock()["charged_us"]
    out = f(*args)
    return out, fabric.clock()["charged_us"] - before


def test_eager_cumsum_on_neuron_equals_the_cpu_and_is_priced_by_its_length():
    """A scan walks each line in order on the vector engine (lines spread
    over the lanes): one line of 16384 costs 16384 cycles at 0.96 GHz, plus
    the engine's 100-cycle wait and the 1.3 us fixed cost of an eager op;
    8 lines of it cost the same (the HBM traffic, 1 MiB, takes less); a
    multiply of as many elements spreads over the lanes."""
    x = torch.randn(8, 16384)
    one, scan = charged(torch.cumsum, x[:1].to("neuron"), 1)
    assert torch.equal(one.cpu(), torch.cumsum(x[:1], 1))
    assert abs(scan - (1.3 + (16384 + 100) / 960)) < 1e-3, scan
    many, scan8 = charged(torch.cumsum, x.to("neuron"), -1)
    assert torch.equal(many.cpu(), torch.cumsum(x, -1))
    assert abs(scan8 - scan) < 1e-3, (scan8, scan)
    _, multiply = charged(torch.mul, x[:1].to("neuron"), 2.0)
    assert multiply < scan / 5, (multiply, scan)


def test_the_selective_scan_is_the_recurrence():
    torch.manual_seed(0)
    b, t, d, n = 2, 7, 5, 3
    x, delta = torch.randn(b, t, d), torch.rand(b, t, d)
    A, B, C = torch.rand(d) + 0.5, torch.randn(b, t, n), torch.randn(b, t, n)
    y = selective_scan(x, delta, A, B, C, torch.ones(t, t, dtype=torch.bool).triu(1))
    h, expected = torch.zeros(b, d, n), []
    for s in range(t):
        h = torch.exp(-delta[:, s] * A)[..., None] * h + \
            (delta[:, s] * x[:, s])[..., None] * B[:, s, None, :]
        expected.append((h * C[:, s, None, :]).sum(-1))
    torch.testing.assert_close(y, torch.stack(expected, 1))


def loss_and_grads(model, device, compiled=False, tokens=None):
    model = model.to(device)
    run = torch.compile(model, backend="neuron", fullgraph=True) if compiled else model
    loss = run(tokens[:, :-1].to(device), tokens[:, 1:].to(device))
    loss.backward()
    return loss.detach().cpu(), {k: p.grad.cpu() for k, p in model.named_parameters()}


def test_the_ssm_on_neuron_eager_and_compiled_matches_the_cpu():
    torch.manual_seed(0)
    cfg = SSMConfig(vocab=32, seq=16, dim=16, inner=32, state=4, layers=2)
    model = SSMLM(cfg)
    tokens = torch.randint(0, cfg.vocab, (3, cfg.seq + 1))
    loss, grads = loss_and_grads(copy.deepcopy(model), "cpu", tokens=tokens)
    eager_loss, eager_grads = loss_and_grads(copy.deepcopy(model), "neuron", tokens=tokens)
    assert torch.equal(eager_loss, loss)
    for k in grads:
        assert torch.equal(eager_grads[k], grads[k]), k
    comp_loss, comp_grads = loss_and_grads(copy.deepcopy(model), "neuron", True, tokens)
    # The compiled matmuls sum in another order (sgemm's blocking).
    torch.testing.assert_close(comp_loss, loss, rtol=1e-5, atol=1e-6)
    for k in grads:
        torch.testing.assert_close(comp_grads[k], grads[k], rtol=1e-4, atol=1e-5, msg=k)
    rows = rows_named("SSMLM")[-2:]
    assert all(r["compiled"] and not r["fallback_ops"] for r in rows), rows


def test_example_10_trains_eager_on_neuron():
    """Three steps of examples/10_ssm.py (small): the loss falls (exit 0)
    and each step prints its modelled Trainium2 time."""
    example = os.path.join(os.environ["NEURON_SOURCE_DIR"], "examples/10_ssm.py")
    proc = subprocess.run([NEURONRUN, "-n", "1", example, "--steps", "3", "--batch", "8", "--lr", "1e-2",
                           "--seq", "16", "--print-every", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("modelled Trainium2 step") == 3, proc.stdout
    assert "(falls)" in proc.stdout, proc.stdout
