"""torch.compile(backend="neuron"): TorchDynamo's graphs through AOTAutograd
and the project's compiler, against eager PyTorch: training parity, graph
breaks, CPU segments, fullgraph errors, mode/options/dynamic behaviour, the
"neuron" device, a tensor-parallel GPT over two ranks, the entry point.
"""
import copy
import importlib.metadata
import os
import subprocess
import sys
import warnings

import pytest

NEURONRUN = os.environ["NEURONRUN"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
sys.path.insert(0, PACKAGE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torchneuron  # noqa: E402
import torchneuron.dynamo  # noqa: E402
from torchneuron.models.plain_gpt import GPT, PlainGPTConfig, loss_fn  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own frames (Dynamo's caches are per process)."""
    torch._dynamo.reset()
    torchneuron.dynamo._warned.clear()  # each test sees its own once-only warnings
    yield
    torch._dynamo.reset()


def names_since(start):
    return [e["name"] for e in torchneuron.compiler.metrics()[start:]]


def train_both(make, batches, loss=lambda out, _: out.square().mean(), steps=20,
               **compile_args):
    """Trains two equal models with SGD, one compiled with backend "neuron",
    one eager, on the same batches: losses and parameters must agree."""
    torch.manual_seed(0)
    net = make()
    ref = copy.deepcopy(net)
    compiled = torch.compile(net, backend="neuron", **compile_args)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    for step in range(steps):
        x, y = batches(step)
        for model, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad()
            value = loss(model(x), y)
            value.backward()
            o.step()
            if model is compiled:
                got = value.detach()
            else:
                torch.testing.assert_close(got, value.detach(), rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"step {step}: {m}")
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_the_entry_point_registers_the_backend():
    points = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert "neuron" in points.names
    assert points["neuron"].value == "torchneuron.dynamo:neuron_backend"
    assert "neuron" in torch._dynamo.list_backends()


def test_mlp_trains_as_eager_with_both_passes_on_the_device():
    start = len(torchneuron.compiler.metrics())
    g = torch.Generator().manual_seed(1)
    train_both(lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)),
               lambda _: (torch.randn(8, 16, generator=g), None))
    entries = torchneuron.compiler.metrics()[start:]
    assert [e["name"].rsplit("_", 1)[1] for e in entries] == ["forward", "backward"]
    assert all(e["compiled"] and not e["fallback_ops"] and e["modelled_us"] > 0
               for e in entries), entries


def test_gpt_trains_as_eager():
    cfg = PlainGPTConfig(vocab=64, seq=16, dim=32, heads=4, layers=2)
    g = torch.Generator().manual_seed(2)

    def batch(_):
        tokens = torch.randint(0, cfg.vocab, (4, cfg.seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    start = len(torchneuron.compiler.metrics())
    # fullgraph: every operator on the device, attention included (its
    # fused CPU kernel becomes batched matmuls, the causal mask, softmax).
    train_both(lambda: GPT(cfg), batch, loss=loss_fn, steps=10, fullgraph=True)
    entries = torchneuron.compiler.metrics()[start:]
    assert entries and all(e["compiled"] and not e["fallback_ops"] for e in entries), entries


def attention_cases():
    """(label, inputs, kwargs, tolerance) for scaled_dot_product_attention."""
    torch.manual_seed(7)
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    k_long, v_long = torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    kv = [torch.randn(2, 2, 6, 8) for _ in range(2)]
    bool_mask = torch.rand(6, 6) > 0.3
    bool_mask[:, 0] = True
    empty_row = bool_mask.clone()
    empty_row[2] = False  # attends nowhere: eager gives 0
    float_mask = torch.randn(6, 6)
    float_mask[4] = float("-inf")
    long = [torch.randn(1, 1, 300, 8, dtype=torch.bfloat16) for _ in range(3)]
    # One product's scores over a quarter of PSUM: each product in tiles of rows.
    longer = [torch.randn(1, 1, 520, 8) for _ in range(3)]
    bf16 = {"rtol": 2e-2, "atol": 2e-2}
    return [("plain", (q, k, v), {}, {}), ("causal", (q, k, v), {"is_causal": True}, {}),
            ("causal, more keys", (q, k_long, v_long), {"is_causal": True}, {}),
            ("causal, more queries", (k_long, q, v), {"is_causal": True}, {}),
            ("scale", (q, k, v), {"scale": 0.5}, {}),
            ("bool mask", (q, k, v), {"attn_mask": bool_mask}, {}),
            ("bool mask, a row attends nowhere", (q, k, v), {"attn_mask": empty_row}, {}),
            ("float mask, a row attends nowhere", (q, k, v), {"attn_mask": float_mask}, {}),
            ("grouped query heads", (q, *kv), {"enable_gqa": True, "is_causal": True}, {}),
            ("bfloat16, causal over 300 positions", long, {"is_causal": True}, bf16),
            ("causal over 520 positions, products in row tiles", longer, {"is_causal": True},
             {})]


@pytest.mark.parametrize("label,args,kwargs,tolerance", attention_cases(),
                         ids=[c[0] for c in attention_cases()])
def test_attention_matches_eager(label, args, kwargs, tolerance):
    F = torch.nn.functional
    leaves = [a.clone().requires_grad_() for a in args]
    refs = [a.clone().requires_grad_() for a in args]
    # A mask's boolean work is the one CPU segment (no boolean operators).
    strict = "attn_mask" not in kwargs
    start = len(torchneuron.compiler.metrics())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(lambda *t: F.scaled_dot_product_attention(*t, **kwargs),
                            backend="neuron", fullgraph=strict)(*leaves)
    cpu_ops = {op for e in torchneuron.compiler.metrics()[start:] for op in e["fallback_ops"]}
    assert cpu_ops <= {"aten.bitwise_not", "aten.all.dim"}, (label, cpu_ops)
    expected = F.scaled_dot_product_attention(*refs, **kwargs)
    torch.testing.assert_close(out, expected, **tolerance)
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    for a, b in zip(leaves, refs):
        torch.testing.assert_close(a.grad, b.grad, **tolerance)

def test_cnn_trains_as_eager():
    g = torch.Generator().manual_seed(3)
    train_both(lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                     nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 5)),
               lambda _: (torch.randn(2, 3, 8, 8, generator=g), None), steps=5)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:  # data-dependent: a graph break
            h = h * 2
        return self.b(torch.relu(h))


def test_a_graph_break_compiles_both_sides_and_trains_as_eager():
    start = len(torchneuron.compiler.metrics())
    g = torch.Generator().manual_seed(4)
    train_both(Branchy, lambda step: ((1 if step % 2 else -1) * torch.rand(4, 8, generator=g),
                                      None))
    graphs = {n.rsplit("_", 1)[0] for n in names_since(start)}
    assert len(graphs) >= 2, names_since(start)


def test_fullgraph_makes_a_graph_break_dynamos_error():
    with pytest.raises(torch._dynamo.exc.Unsupported, match="Data-dependent"):
        torch.compile(Branchy(), backend="neuron", fullgraph=True)(torch.randn(4, 8))


def batch_norm_cnn():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten())


def test_an_operator_the_device_lacks_runs_on_the_cpu_with_a_warning():
    torch.manual_seed(5)
    net = batch_norm_cnn()
    ref = copy.deepcopy(net)
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(net, backend="neuron")(x)
    torch.testing.assert_close(out, ref(x))
    torch.testing.assert_close(net[1].running_mean, ref[1].running_mean)
    assert net[1].num_batches_tracked.item() == ref[1].num_batches_tracked.item() == 1
    text = " ".join(str(w.message) for w in caught)
    assert "batch_norm" in text and "on the CPU" in text, text


@pytest.mark.parametrize("how", ["fullgraph", "option"])
def test_strict_compilation_refuses_the_operator_by_name(how):
    args = {"fullgraph": True} if how == "fullgraph" else {"options": {"fallback": False}}
    label = "fullgraph=True" if how == "fullgraph" else "options fallback=False"
    with pytest.raises(Exception) as raised:
        torch.compile(batch_norm_cnn(), backend="neuron", **args)(torch.randn(2, 3, 8, 8))
    text = str(raised.value)
    assert "cannot run on the device" in text and f"({label})" in text, text
    # The op the device refuses first is batch norm's step counter (an i64
    # add); torch.nn's modules have no user source line, so the module.
    assert "aten.add (module 1 (BatchNorm2d))" in text, text


def test_a_refused_operator_is_named_with_its_own_source_line():
    weight = torch.ones(8)

    def f(x):
        a = torch.nn.functional.layer_norm(x, (8,), weight, weight)
        b = torch.nn.functional.layer_norm(a, (8,), weight, weight)
        return torch.cumprod(torch.relu(b), 0)  # the line the error names
    line = f.__code__.co_firstlineno + 3
    with torch.no_grad(), pytest.raises(Exception) as raised:
        torch.compile(f, backend="neuron", fullgraph=True)(torch.randn(4, 8))
    text = str(raised.value)
    assert f'aten.cumprod (File "{__file__}", line {line}, in f)' in text, text


def test_mode_and_unknown_options_warn_and_compile_the_default():
    x = torch.randn(2, 3)
    lin = nn.Linear(3, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = torch.compile(lin, backend="neuron", mode="max-autotune")(x)
        torch._dynamo.reset()
        b = torch.compile(lin, backend="neuron", options={"bogus": 1})(x)
    text = " ".join(str(w.message) for w in caught)
    assert "mode='max-autotune' is not supported; compiling with the default mode" in text
    assert "unknown option 'bogus' ignored (known: fallback)" in text
    torch.testing.assert_close(a, lin(x))
    torch.testing.assert_close(b, lin(x))


def test_each_input_shape_compiles_static_executables():
    torch.manual_seed(6)
    lin = nn.Sequential(nn.Linear(5, 3), nn.ReLU())
    start = len(torchneuron.compiler.metrics())
    compiled = torch.compile(lin, backend="neuron", dynamic=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 3):
            x = torch.randn(n, 5, requires_grad=True)
            out = compiled(x)
            out.sum().backward()
            torch.testing.assert_close(out, lin(x))
    assert any("shapes are static on the device" in str(w.message) for w in caught)
    names = names_since(start)
    # Three shapes, forward and backward each; the fourth call reuses one.
    assert sorted(n.split("_", 2)[2] for n in names) == sorted(
        f"s{i}_{kind}" for i in range(3) for kind in ("forward", "backward")), names
    entries = torchneuron.compiler.metrics()[start:]
    assert all(e["compiled"] and not e["fallback_ops"] for e in entries), entries


def test_a_model_on_the_neuron_device_trains_as_eager_and_stays_there():
    def make():
        return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    torch.manual_seed(8)
    net, ref = make().to("neuron"), make()
    ref.load_state_dict({k: v.cpu() for k, v in net.state_dict().items()})
    compiled = torch.compile(net, backend="neuron", fullgraph=True)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        x = torch.randn(8, 16, generator=g)
        opt.zero_grad()
        ref_opt.zero_grad()
        out = compiled(x.to("neuron"))
        assert out.device.type == "neuron"
        out.square().mean().backward()
        ref(x).square().mean().backward()
        assert all(p.grad.device.type == "neuron" for p in net.parameters())
        opt.step()
        ref_opt.step()
    for p, q in zip(net.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5)


def test_explain_reports_the_graphs_and_breaks():
    explanation = torch._dynamo.explain(Branchy())(torch.randn(4, 8))
    assert explanation.graph_count == 2 and explanation.graph_break_count == 1, explanation


def test_a_tensor_parallel_gpt_compiles_and_trains_as_eager():
    script = os.path.join(os.path.dirname(__file__), "scripts", "dynamo_tp.py")
    proc = subprocess.run([NEURONRUN, "-n", "2", script], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok dynamo tp") == 2, proc.stdout
