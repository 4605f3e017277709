"""torch.profiler on "neuron" (runtime/aten/src/kineto_profiler.cc,
docs/device.md): with ProfilerActivity.PrivateUse1 each eager op's device
time is the modelled time the device model charged it (the op's
torchneuron.fabric.eager_records() entry), key_averages().table() has the
device columns, and export_chrome_trace holds the device's kernel lane."""
import json
import os
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
os.environ.pop("LOCAL_RANK", None)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import torchneuron  # noqa: E402,F401  (registers the device)
from torchneuron import fabric  # noqa: E402

NS = 1e-3  # a kernel's duration is the modelled time rounded to the nanosecond


def _profile(fn, activities=(ProfilerActivity.CPU, ProfilerActivity.PrivateUse1)):
    fabric.reset_eager()
    with profile(activities=list(activities)) as prof:
        fn()
    return prof, fabric.eager_records()


def _step():
    """A small training step: native matmuls and vector ops forward and
    backward (backward's ops run on autograd's thread), and a CPU fallback."""
    w = torch.randn(32, 32, device="neuron", requires_grad=True)
    x = torch.randn(8, 32, device="neuron")

    def run():
        (x @ w).relu().sum().backward()
        torch.sort(x, dim=1)
    return run


def test_each_ops_device_time_is_its_modelled_time():
    prof, records = _profile(_step())
    assert {r["kind"] for r in records} >= {"matmul", "vector", "fallback"}
    ops = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU and e.kernels]
    kernels = sorted((k.name, k.duration) for e in ops for k in e.kernels)
    expected = sorted((f"{r['op']} [{r['kind']}]", r["modelled_us"]) for r in records)
    assert [name for name, _ in kernels] == [name for name, _ in expected]
    for (_, device_us), (name, modelled_us) in zip(kernels, expected):
        assert device_us == pytest.approx(modelled_us, abs=NS), name
    for e in ops:  # each kernel is the device time of the op that issued it
        (kernel,) = e.kernels
        assert kernel.name.split(" ")[0].split(".")[0] == e.name
        assert e.self_device_time_total == pytest.approx(kernel.duration)
    total = sum(a.self_device_time_total for a in prof.key_averages()
                if a.device_type == torch.autograd.DeviceType.CPU)
    assert total == pytest.approx(sum(r["modelled_us"] for r in records), abs=NS * len(records))


def test_the_table_has_the_device_columns():
    a = torch.randn(64, 64, device="neuron")
    prof, (mm,) = _profile(lambda: a @ a)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=5)
    header = table.splitlines()[1]
    assert "Self NEURON" in header and "NEURON total" in header
    row = next(line for line in table.splitlines() if line.strip().startswith("aten::mm "))
    assert f"{mm['modelled_us']:.3f}us" in row
    assert f"Self NEURON time total: {mm['modelled_us']:.3f}us" in table


def test_the_chrome_trace_holds_the_device_lane(tmp_path):
    a = torch.randn(64, 64, device="neuron")
    prof, records = _profile(lambda: (a @ a).relu())
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert [k["name"] for k in kernels] == [f"{r['op']} [{r['kind']}]" for r in records]
    for k, r in zip(kernels, records):
        assert (k["pid"], k["tid"]) == (0, 0)  # neuron:0's compute lane
        assert k["dur"] == pytest.approx(r["modelled_us"], abs=NS)
        assert k["args"]["sim start us"] == pytest.approx(r["start_us"])
    host = {e["args"]["External id"]: e["name"] for e in events if e.get("cat") == "cpu_op"}
    assert [host[k["args"]["External id"]] for k in kernels] == ["aten::mm", "aten::relu"]
    names = {(e["pid"], e["args"].get("name")) for e in events if e.get("ph") == "M"}
    assert (0, "neuron") in names and (0, "compute (modelled)") in names


def test_a_cpu_only_profile_has_no_device_time():
    a = torch.randn(16, 16, device="neuron")
    prof, records = _profile(lambda: a @ a, activities=(ProfilerActivity.CPU,))
    assert records and not any(e.kernels for e in prof.events())
    # The next device profile holds only its own ops.
    prof, records = _profile(lambda: a + a)
    assert [k.name for e in prof.events() for k in e.kernels] == ["aten::add.Tensor [vector]"]


def test_the_autograd_profilers_device_time_is_the_modelled_time_in_whole_us():
    # torch.autograd.profiler's legacy device timing reads the device's
    # profiler stubs (the compute clock) and keeps whole microseconds.
    from torch.autograd.profiler import profile as autograd_profile
    a = torch.randn(256, 256, device="neuron")
    fabric.reset_eager()
    with autograd_profile(use_device="neuron") as prof:
        (a @ a).relu()
    mm, relu = fabric.eager_records()
    events = {e.name: e for e in prof.function_events}
    for name, record in (("aten::mm", mm), ("aten::relu", relu)):
        assert record["modelled_us"] >= 2
        device_us = events[name].self_device_time_total  # the modelled time, truncated
        assert record["modelled_us"] - 1 < device_us <= record["modelled_us"] + 1e-6, name
    assert events["aten::matmul"].device_time_total == events["aten::mm"].device_time_total
    assert all(e.cpu_time_total >= 0 for e in prof.function_events)


def test_a_compiled_graphs_run_is_a_device_kernel_of_its_modelled_time():
    f = torch.compile(lambda x, w: torch.relu(x @ w), backend="neuron")
    x, w = torch.randn(8, 16, device="neuron"), torch.randn(16, 4, device="neuron")
    f(x, w)  # compiled outside the profile
    fabric.reset_graph_runs()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        f(x, w)
    (run,) = fabric.graph_runs()
    name = f"graph {run['name']} [compiled graph]"
    kernels = [k for e in prof.events() for k in e.kernels if k.name == name]
    assert len(kernels) == 1, [k.name for e in prof.events() for k in e.kernels]
    assert kernels[0].duration == pytest.approx(run["modelled_us"], abs=NS)
