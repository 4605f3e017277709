"""Adaptive eager (python/torchneuron/adaptive_eager.py, runtime/aten
adaptive_eager.h): results bitwise equal to plain eager on the eager
benchmark's model (and an embedding model and a transformer layer), each flush point seen in the statistics, a region met
again served by the compile cache, a lower modelled step, and nothing
changed while it is off (the default)."""
import os
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
sys.path.insert(0, PACKAGE)
sys.path.insert(0, os.path.join(os.environ["NEURON_SOURCE_DIR"], "benchmarks"))
os.environ.pop("NEURON_ADAPTIVE_EAGER", None)
os.environ.pop("NEURON_ADAPTIVE_EAGER_MAX_OPS", None)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import eager_bench  # noqa: E402
from torchneuron import fabric  # noqa: E402

torch.set_num_threads(1)  # small ops: threads only contend on a shared machine

REGION = "neuron::adaptive_region"


def _embedding_model(device):
    """A second model, other ops: embedding (integer inputs), ReLU, MSE,
    SGD with momentum."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 32), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 32, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 50, (8, 4), generator=g).to(device)
    y = torch.randn(8, 1, generator=g).to(device)
    return model, opt, x, y


def _transformer_layer(device):
    """A third: a transformer encoder layer (attention, layer norms), Adam."""
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, 32, generator=g).to(device)
    return model, opt, x, torch.zeros(2, 8, 32).to(device)


def _mse_step(model, opt, x, y):
    return eager_bench.step(model, opt, x, y, loss_fn=F.mse_loss)


def _train(make, step, adaptive, steps=3):
    """Losses, gradients and parameters (on the CPU) after each step, and
    each step's modelled time (a sync ends it)."""
    model, opt, x, y = make()
    seen, modelled = [], []
    with torch.neuron.adaptive_eager(adaptive):
        for _ in range(steps):
            before = fabric.clock()["compute_us"]
            loss = step(model, opt, x, y)
            torch.neuron.synchronize()
            modelled.append(fabric.clock()["compute_us"] - before)
            seen.append([loss.detach()] + [p.grad for p in model.parameters()] +
                        [p.detach() for p in model.parameters()])
            seen[-1] = [t.cpu() for t in seen[-1]]
    return seen, modelled


MODELS = {
    "eager_bench": (lambda: eager_bench.make(torch, "neuron"), eager_bench.step),
    "embedding": (lambda: _embedding_model("neuron"), _mse_step),
    "transformer_layer": (lambda: _transformer_layer("neuron"), _mse_step),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bitwise_equal_to_plain_eager_with_a_lower_modelled_step(name):
    make, step = MODELS[name]
    plain, plain_us = _train(make, step, False)
    torch.neuron.reset_adaptive_eager_stats()
    fused, fused_us = _train(make, step, True)
    stats = torch.neuron.adaptive_eager_stats()
    for k, (a, b) in enumerate(zip(plain, fused)):
        assert all(torch.equal(u, v) for u, v in zip(a, b)), f"step {k} differs"
    assert stats["regions"] >= 3 and stats["refused"] == 0, stats
    assert fused_us[-1] < plain_us[-1], (plain_us, fused_us)
    assert stats["saved_us"] > 0 and stats["fused_us"] < stats["eager_us"], stats


def test_the_next_steps_regions_are_compile_cache_hits():
    model, opt, x, y = eager_bench.make(torch, "neuron")
    with torch.neuron.adaptive_eager():
        for _ in range(2):  # the first steps: AdamW's state is made
            eager_bench.step(model, opt, x, y)
            torch.neuron.synchronize()
        before = torch.neuron.adaptive_eager_stats()
        eager_bench.step(model, opt, x, y)
        torch.neuron.synchronize()
        after = torch.neuron.adaptive_eager_stats()
    regions = after["regions"] - before["regions"]
    assert regions >= 1
    assert after["cache_hits"] - before["cache_hits"] == regions, (before, after)
    assert after["cache_misses"] == before["cache_misses"]


def _reasons(action):
    """The flush reasons counted while `action` runs (adaptive eager on,
    after a queued op)."""
    x = torch.randn(16, 16, device="neuron")
    with torch.neuron.adaptive_eager():
        torch.neuron.synchronize()
        before = dict(torch.neuron.adaptive_eager_stats()["by_reason"])
        y = x * 2 + 1  # queued
        assert torch.neuron.adaptive_eager_stats()["pending_ops"] == 2
        action(y)
        after = torch.neuron.adaptive_eager_stats()
    assert after["pending_ops"] == 0
    return {k: v - before.get(k, 0) for k, v in after["by_reason"].items()
            if v != before.get(k, 0)}


@pytest.mark.parametrize("read", [lambda y: y.cpu(), lambda y: y.sum().item(),
                                  lambda y: y.tolist()], ids=["cpu", "item", "tolist"])
def test_a_host_read_flushes(read):
    assert _reasons(read) == {"host_read": 1}


def test_a_sync_flushes():
    assert _reasons(lambda y: torch.neuron.synchronize()) == {"sync": 1}
    assert _reasons(lambda y: fabric.clock()) == {"sync": 1}
    assert _reasons(lambda y: torch.neuron.Event().record()) == {"sync": 1}


def test_an_op_the_compiler_cannot_express_flushes_and_is_charged_as_plain_eager():
    fabric.reset_eager()
    assert _reasons(lambda y: y.double()) == {"unsupported_op": 1}  # f64: not in the IR
    ops = [r["op"] for r in fabric.eager_records()]
    assert ops[-2:] == [REGION, "aten::_copy_from"], ops  # the f64 copy, as plain eager


def test_an_eager_nki_kernel_flushes_and_is_charged_after_the_region():
    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    def add_one(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), 1.0))
        return out

    nki.as_op(nki.jit(add_one, reference=lambda a: a + 1, name="add_one"),
              "adaptive_eager_test::add_one")
    fabric.reset_eager()
    kernel = torch.ops.adaptive_eager_test.add_one
    assert _reasons(lambda y: kernel(y)) == {"other": 1}
    ops = [r["op"] for r in fabric.eager_records()]
    assert ops[-2:] == [REGION, "nki::add_one"], ops  # the region first, then the kernel


def test_the_size_limit_flushes(monkeypatch):
    monkeypatch.setenv("NEURON_ADAPTIVE_EAGER_MAX_OPS", "3")
    x = torch.randn(8, device="neuron")
    with torch.neuron.adaptive_eager():
        torch.neuron.synchronize()
        before = torch.neuron.adaptive_eager_stats()
        for _ in range(7):
            x = x + 1
        after = torch.neuron.adaptive_eager_stats()
    assert after["by_reason"].get("size", 0) - before["by_reason"].get("size", 0) == 2
    assert after["pending_ops"] == 1


def test_a_collective_flushes():
    import torch.distributed as dist
    dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _reasons(lambda y: dist.all_reduce(y)) == {"collective": 1}
    finally:
        dist.destroy_process_group()


def test_off_by_default_plain_eager_charges_each_op():
    assert not torch.neuron.is_adaptive_eager_enabled()
    before = torch.neuron.adaptive_eager_stats()
    model, opt, x, y = eager_bench.make(torch, "neuron")
    fabric.reset_eager()
    start = fabric.clock()["compute_us"]
    eager_bench.step(model, opt, x, y)
    records = fabric.eager_records()
    assert REGION not in {r["op"] for r in records}
    assert fabric.clock()["compute_us"] - start == pytest.approx(
        sum(r["modelled_us"] for r in records))
    after = torch.neuron.adaptive_eager_stats()
    assert (after["regions"], after["ops"]) == (before["regions"], before["ops"])


def test_a_with_block_restores_the_setting_and_a_bad_value_is_refused():
    with torch.neuron.adaptive_eager():
        assert torch.neuron.is_adaptive_eager_enabled()
        with torch.neuron.adaptive_eager(False):
            assert not torch.neuron.is_adaptive_eager_enabled()
        assert torch.neuron.is_adaptive_eager_enabled()
    assert not torch.neuron.is_adaptive_eager_enabled()
    with pytest.raises(TypeError, match="enabled must be a bool"):
        torch.neuron.adaptive_eager("yes")


def test_neuron_adaptive_eager_1_turns_it_on_and_regions_enter_the_disk_cache(tmp_path):
    import subprocess
    script = ("import torch, torchneuron\n"
              "assert torch.neuron.is_adaptive_eager_enabled()\n"
              "x = torch.randn(4, 4, device='neuron')\n"
              "y = (x @ x).relu()\n"
              "assert torch.neuron.adaptive_eager_stats()['pending_ops'] == 2\n"
              "assert torch.equal(y.cpu(), (x.cpu() @ x.cpu()).relu())\n"
              "s = torch.neuron.adaptive_eager_stats()\n"
              "print(s['by_reason'], s['cache_misses'])\n")
    cache = tmp_path / "cache"
    env = dict(os.environ, NEURON_ADAPTIVE_EAGER="1", PYTHONPATH=PACKAGE,
               NEURON_CACHE_DIR=str(cache))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'host_read': 1} 1"
    # The region's plan is a compile cache entry: the next process reads it.
    assert len(list(cache.glob("*.nexe"))) == 1


def test_a_region_the_compiler_refuses_is_split_around_the_op_it_names():
    x = torch.randn(8, 8, device="neuron")
    low = torch.zeros(8, 8, device="neuron")
    with torch.neuron.adaptive_eager():
        torch.neuron.synchronize()
        fabric.reset_eager()
        before = torch.neuron.adaptive_eager_stats()
        a = x * 3
        b = torch.clamp(a, min=low)  # tensor bounds: the device's clamp takes numbers
        c = b + a
        torch.neuron.synchronize()
        after = torch.neuron.adaptive_eager_stats()
    assert [r["op"] for r in fabric.eager_records()] == [REGION, "aten::clamp.Tensor", REGION]
    assert after["refused"] - before["refused"] == 1
    assert "region op 1 (aten::clamp.Tensor)" in after["last_refusal"]
    assert torch.equal(c.cpu(), torch.clamp(x.cpu() * 3, min=0) + x.cpu() * 3)


def test_a_plan_slower_than_its_ops_is_charged_as_plain_eager():
    x = torch.randn(16, 16, device="neuron")
    fabric.reset_eager()
    x * 2  # plain eager: its own cost
    eager_us = fabric.eager_records()[-1]["modelled_us"]
    with torch.neuron.adaptive_eager():
        before = torch.neuron.adaptive_eager_stats()
        x * 2  # one small op: the plan's loads and stores cost more than the op
        torch.neuron.synchronize()
        after = torch.neuron.adaptive_eager_stats()
    record = fabric.eager_records()[-1]
    assert (record["op"], record["kind"]) == (REGION, "region_eager")
    assert record["modelled_us"] == pytest.approx(eager_us)
    assert after["kept_eager"] - before["kept_eager"] == 1
