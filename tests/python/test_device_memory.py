"""The "neuron" device's memory with torch.cuda's meanings: active against
allocated while a freed block waits on stream use, memory_summary in
torch.cuda.memory_summary's form, memory_snapshot read by PyTorch's own
visualiser (torch.cuda._memory_viz) with its recorded history, and peaks by phase on a small
training loop. One process, device 0.
"""
import gc
import os
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
sys.path.insert(0, PACKAGE)
os.environ.pop("LOCAL_RANK", None)

import torch  # noqa: E402
import torch.cuda.memory  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.cuda import _memory_viz  # noqa: E402

import torchneuron  # noqa: E402,F401

MIB = 1 << 20


def levels():
    gc.collect()  # frames of earlier failures may hold tensors
    s = torch.neuron.memory_stats()
    return (s["allocated_bytes.all.current"], s["active_bytes.all.current"],
            s["requested_bytes.all.current"], s["active.all.current"])


def states():
    """address -> block state in memory_snapshot()."""
    return {seg["address"]: seg["blocks"][0]["state"] for seg in torch.neuron.memory_snapshot()}


# --- active against allocated -------------------------------------------------

def test_a_block_freed_after_use_on_another_stream_stays_active_until_the_next_allocation():
    torch.neuron.empty_cache()
    allocated, active, requested, blocks = levels()
    assert active == allocated
    x = torch.empty(3 * MIB, dtype=torch.uint8, device="neuron")  # a 4 MiB block
    address = x.data_ptr()
    x.record_stream(torch.neuron.Stream())
    del x
    # As CUDA's allocator: no longer allocated, still active (and requested).
    assert levels() == (allocated, active + 4 * MIB, requested + 3 * MIB, blocks + 1)
    assert torch.accelerator.memory_stats()["active_bytes.all.current"] == active + 4 * MIB
    assert states()[address] == "active_pending_free"
    y = torch.empty(10, device="neuron")  # the allocator processes the stream's use
    assert levels() == (allocated + 512, active + 512, requested + 40, blocks + 1)
    assert states()[address] == "inactive"
    del y


def test_use_on_the_allocation_stream_and_empty_cache_leave_no_block_pending():
    torch.neuron.empty_cache()
    before = levels()
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        x = torch.empty(MIB, dtype=torch.uint8, device="neuron")
    x.record_stream(side)  # its own stream: nothing to wait for
    del x
    assert levels() == before
    z = torch.empty(MIB, dtype=torch.uint8, device="neuron")
    z.record_stream(side)
    del z
    assert levels()[1] == before[1] + 2 * MIB
    torch.neuron.empty_cache()  # completes the pending free, then releases it
    assert levels() == before
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated()


# --- memory_summary -----------------------------------------------------------

def test_memory_summary_is_torch_cuda_memory_summarys_table(monkeypatch):
    x = torch.empty(5 * MIB, dtype=torch.uint8, device="neuron")
    y = torch.empty(100, device="neuron")
    stats = torch.neuron.memory_stats()
    text = torchneuron.device_memory.format_memory_summary(stats, 0)
    # torch.cuda's own formatting of the same figures is the reference.
    monkeypatch.setattr(torch.cuda.memory, "memory_stats", lambda device=None: stats)
    monkeypatch.setattr(torch.cuda.memory, "_get_device_index", lambda d, optional=False: 0)
    reference = torch.cuda.memory.memory_summary(0)
    for ours, cuda in (("HBM reserved memory", "GPU reserved memory"),
                       ("HBM reserved segments", "GPU reserved segments"),
                       ("Oversize HBM segments", "Oversize GPU segments")):
        reference = reference.replace(cuda, ours)
    ours, theirs = text.splitlines(), reference.splitlines()
    assert len(ours) == len(theirs)
    assert ours[4:] == theirs[4:]  # every metric row
    assert all(len(line) == 77 for line in ours)
    assert "PyTorch Neuron memory summary, device ID 0" in ours[1]
    assert f"Neuron OOMs: {stats['num_ooms']} " in ours[3]
    assert torch.neuron.memory_summary() == torchneuron.device_memory.format_memory_summary(
        torch.neuron.memory_stats(), 0)
    short = torch.neuron.memory_summary(abbreviated=True)
    assert "from large pool" not in short and "Active memory" in short
    del x, y


# --- memory_snapshot ------------------------------------------------------------

def test_memory_snapshot_is_read_by_pytorchs_memory_visualiser(tmp_path):
    torch.neuron.empty_cache()
    live = torch.empty(3 * MIB, dtype=torch.uint8, device="neuron")
    cached = torch.empty(1000, dtype=torch.uint8, device="neuron")
    pending = torch.empty(MIB // 2, dtype=torch.uint8, device="neuron")
    pending.record_stream(torch.neuron.Stream())
    del cached, pending
    snapshot = torch.neuron.memory._snapshot()
    segments = snapshot["segments"]
    stats = torch.neuron.memory_stats()
    on_device = [s for s in segments if s["device"] == 0]
    assert sum(s["total_size"] for s in on_device) == stats["reserved_bytes.all.current"]
    assert sum(s["allocated_size"] for s in on_device) == stats["allocated_bytes.all.current"]
    assert sum(s["active_size"] for s in on_device) == stats["active_bytes.all.current"]
    assert sorted(s["blocks"][0]["state"] for s in on_device) == [
        "active_allocated", "active_pending_free", "inactive"]
    # PyTorch's visualiser: its accounting checks pass and it shows each state.
    summary = _memory_viz.segsum(snapshot)
    assert "segments: 3" in summary and "total_reserved: 4.5MiB" in summary
    assert "total_allocated: 3.0MiB" in summary
    flame = _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines)
    assert f"stream_0;active_allocated;<non-python> {3 * MIB}" in flame
    assert "active_pending_free" in flame and "inactive" in flame
    assert "seg_" in _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert "snapshot.pickle" in _memory_viz.segment_plot(snapshot)
    assert "snapshot.pickle" in _memory_viz.trace_plot(snapshot)
    assert _memory_viz.trace(snapshot) == ""  # no history recorded (not asked for)
    path = tmp_path / "snapshot.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    import pickle
    assert pickle.loads(path.read_bytes())["segments"] == torch.neuron.memory_snapshot()
    del live


def test_recorded_history_is_read_by_pytorchs_trace_views():
    torch.neuron.empty_cache()
    torch.neuron.memory._record_memory_history(max_entries=100)
    try:
        x = torch.empty(3 * MIB, dtype=torch.uint8, device="neuron")
        big = x.data_ptr()
        x.record_stream(torch.neuron.Stream())
        del x
        y = torch.empty(10, device="neuron")  # completes x's free first
        small = y.data_ptr()
        del y
        torch.neuron.empty_cache()
        snapshot = torch.neuron.memory._snapshot()
    finally:
        torch.neuron.memory._record_memory_history(None)
    trace = [(e["action"], e["addr"], e["size"]) for e in snapshot["device_traces"][0]]
    assert trace == [
        ("segment_alloc", big, 4 * MIB), ("alloc", big, 3 * MIB), ("free_requested", big, 3 * MIB),
        ("free_completed", big, 3 * MIB), ("segment_alloc", small, 512), ("alloc", small, 40),
        ("free_requested", small, 40), ("free_completed", small, 40),
        ("segment_free", small, 512), ("segment_free", big, 4 * MIB)]
    text = _memory_viz.trace(snapshot)
    assert f"a = cudaMalloc({big}, 4.0MiB)\nb = a[0:3.0MiB]\ndel b # 3.0MiB\n" in text
    assert "cudaFree(a) # 4.0MiB" in text
    assert "snapshot.pickle" in _memory_viz.trace_plot(snapshot, filter_freed=True)
    assert torch.neuron.memory._snapshot()["device_traces"][0] == []  # stopped and dropped
    with pytest.raises(ValueError, match='enabled must be None, "state" or "all", got \'yes\''):
        torch.neuron.memory._record_memory_history("yes")


# --- peaks by phase -------------------------------------------------------------

def test_phase_peaks_of_a_small_training_loop():
    gc.collect()  # frames of earlier failures may hold tensors
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.set_memory_phase(None) is None
    start = torch.neuron.memory_allocated()
    torch.manual_seed(0)
    with torch.neuron.memory_phase("load"):
        model = nn.Linear(256, 256, bias=False).to("neuron")  # 256 KiB of weights
    with torch.neuron.memory_phase("warmup"):
        optimizer = torch.optim.Adam(model.parameters())
        for _ in range(2):
            model(torch.randn(32, 256, device="neuron")).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    steady = torch.neuron.memory_allocated()
    with torch.neuron.memory_phase("step"):
        for _ in range(3):
            model(torch.randn(32, 256, device="neuron")).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    assert torch.neuron.set_memory_phase(None) is None  # the block restored "no phase"
    peaks = torch.neuron.memory_phase_peaks()
    assert list(peaks) == ["load", "warmup", "step"]
    assert peaks["load"]["allocated_bytes"] == start + 256 * 1024
    # Adam's two moments and the gradient (3 x 256 KiB) arrive in the warm-up.
    assert peaks["warmup"]["allocated_bytes"] >= start + 4 * 256 * 1024
    assert peaks["step"]["allocated_bytes"] >= steady
    for p in peaks.values():
        assert p["reserved_bytes"] >= p["active_bytes"] >= p["allocated_bytes"]
    # Every allocation since the reset fell in a phase: the overall peak is theirs.
    assert torch.neuron.max_memory_allocated() == max(p["allocated_bytes"] for p in peaks.values())
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.memory_phase_peaks() == peaks  # phases keep their peaks


def test_memory_phase_refuses_a_name_that_is_not_a_string():
    with pytest.raises(TypeError, match="set_memory_phase: phase must be a str or None, got int"):
        torch.neuron.set_memory_phase(3)
