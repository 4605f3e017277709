"""The "neuron" device in one process: the device module, torch.accelerator,
the allocator's accounting and out-of-memory error, parity of operators with
the CPU (forward and backward, bitwise), autocast, random numbers, costs on
the simulated clock, and the errors for bad input.
"""
import os
import subprocess
import sys
import textwrap

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
sys.path.insert(0, PACKAGE)
os.environ.pop("LOCAL_RANK", None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchneuron  # noqa: E402
from torchneuron import fabric  # noqa: E402

NEURON = torch.device("neuron", 0)


def run_python(code, **env):
    """Runs `code` in a fresh interpreter with `env` added; returns it done."""
    full = dict(os.environ, PYTHONPATH=PACKAGE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full,
                          capture_output=True, text=True, timeout=120)


# --- the device module and torch.accelerator --------------------------------

def test_import_torch_alone_registers_the_device():
    done = run_python("""
        import torch
        x = torch.ones(2, device="neuron")
        print(torch.accelerator.current_accelerator(), x.device, x.is_neuron)
        print(repr(x))
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "neuron neuron:0 True"
    assert lines[1] == "tensor([1., 1.], device='neuron:0')"


def test_device_count_follows_the_topology_and_lnc():
    assert torch.neuron.device_count() == 64  # 16 chips x 8 cores / LNC 2
    assert torch.accelerator.device_count() == 64
    done = run_python("import torch; print(torch.neuron.device_count())",
                      NEURON_LOGICAL_NC_CONFIG="1")
    assert done.stdout.strip() == "128", done.stderr
    done = run_python("import torch; print(torch.neuron.device_count())",
                      NEURON_RT_VISIBLE_CORES="4-7,9")
    assert done.stdout.strip() == "5", done.stderr


def test_bad_visible_cores_is_refused_naming_the_variable():
    done = run_python("import torch; torch.neuron.device_count()",
                      NEURON_RT_VISIBLE_CORES="2-70")
    assert done.returncode != 0
    assert "NEURON_RT_VISIBLE_CORES: core 70 is beyond the node's 64 logical cores" in done.stderr


def test_current_device_defaults_to_local_rank():
    done = run_python("import torch; print(torch.neuron.current_device(), "
                      "torch.accelerator.current_device_index())", LOCAL_RANK="3")
    assert done.stdout.split() == ["3", "3"], done.stderr


def test_set_device_and_the_device_context():
    torch.accelerator.set_device_index(2)
    assert torch.neuron.current_device() == 2
    assert torch.empty(1, device="neuron").device == torch.device("neuron", 2)
    with torch.neuron.device(5):
        assert torch.neuron.current_device() == 5
    assert torch.neuron.current_device() == 2
    torch.neuron.set_device("neuron:0")
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.synchronize()
    torch.neuron.synchronize()
    assert torch.neuron.get_device_name() == "neuroncore-v3 (LNC=2)"
    assert torch.neuron.get_device_properties().total_memory == 2 * 12884901888


def test_device_index_beyond_the_count_is_refused_naming_both():
    with pytest.raises(RuntimeError, match=r"device index 64 is invalid: this process sees 64 "
                                            r"neuron devices \(neuron:0 to neuron:63\)"):
        torch.neuron.set_device(64)
    with pytest.raises(RuntimeError, match="device index 70 is invalid"):
        torch.empty(3, device="neuron:70")


def test_tensor_methods_for_the_renamed_device():
    x = torch.arange(4.0)
    y = x.neuron()
    assert y.is_neuron and not x.is_neuron
    assert torch.equal(y.cpu(), x)
    m = nn.Linear(3, 2).neuron()
    assert m.weight.device == NEURON


def test_streams_and_events():
    s = torch.neuron.Stream()
    assert s.device == NEURON
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() != s
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    a = torch.randn(256, 256, device="neuron")
    a @ a
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0  # modelled milliseconds
    assert s.query()


# --- memory -----------------------------------------------------------------

def test_allocator_accounting():
    torch.neuron.empty_cache()
    base = torch.neuron.memory_allocated()
    x = torch.empty(1000, dtype=torch.uint8, device="neuron")  # 1024 B: rounded to 512 B
    assert torch.neuron.memory_allocated() == base + 1024
    y = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")  # 3 MiB: rounded to 2 MiB
    assert torch.neuron.memory_allocated() == base + 1024 + (4 << 20)
    peak = torch.neuron.max_memory_allocated()
    del x, y
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.memory_reserved() >= base + 1024 + (4 << 20)  # cached
    assert torch.neuron.max_memory_allocated() == peak
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    z = torch.empty(1000, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_stats()["num_cache_hits"] >= 1
    del z
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated() == base


def test_results_of_cpu_kernels_count_as_device_memory():
    base = torch.neuron.memory_allocated()
    x = torch.ones(1 << 16, device="neuron")
    y = x * 2  # the CPU kernel's new tensor, adopted
    assert torch.neuron.memory_allocated() >= base + 2 * (1 << 18)
    del x, y
    assert torch.neuron.memory_allocated() == base


def test_out_of_memory_names_the_sizes(tmp_path):
    device = open(os.path.join(SOURCE, "configs/devices/neuroncore-v3.textproto")).read()
    small = device.replace("capacity_bytes: 12884901888", "capacity_bytes: 33554432")  # 32 MiB
    path = tmp_path / "small.textproto"
    path.write_text(small)
    done = run_python("""
        import torch
        keep = torch.empty(40 << 20, dtype=torch.uint8, device="neuron")  # 40 of 64 MiB
        try:
            torch.empty(30 << 20, dtype=torch.uint8, device="neuron")
        except torch.OutOfMemoryError as e:
            print(e)
        print(torch.neuron.memory_stats()["num_ooms"])
    """, NEURON_DEVICE_FILE=str(path))
    assert done.returncode == 0, done.stderr
    assert ("Neuron out of memory. Tried to allocate 30.00 MiB. Device neuron:0 has a total "
            "capacity of 64.00 MiB of which 24.00 MiB is free. Of the allocated memory 40.00 MiB "
            "is allocated by PyTorch, and 0.00 KiB is reserved by PyTorch but unallocated."
            in done.stdout), done.stdout
    assert done.stdout.split()[-1] == "1"


# --- operators ----------------------------------------------------------------

def _same(a, b, what):
    if isinstance(a, (tuple, list)):
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{what}[{i}]")
        return
    if not isinstance(a, torch.Tensor):
        assert a == b, what
        return
    assert b.device.type == "neuron", f"{what}: result on {b.device}"
    assert a.dtype == b.dtype and a.shape == b.shape, what
    assert torch.equal(a, b.cpu()) or (a.isnan().any() and torch.equal(a.nan_to_num(), b.cpu().nan_to_num())), \
        f"{what}: differs from the CPU by {(a.float() - b.cpu().float()).abs().max()}"


OPS = {
    "mm": (lambda a, b: a @ b, [(8, 16), (16, 4)]),
    "addmm": (lambda a, b, c: torch.addmm(c, a, b), [(8, 16), (16, 4), (4,)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(2, 5, 16), (8, 16), (8,)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 4, 5), (3, 5, 6)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1, stride=2), [(2, 3, 9, 9), (4, 3, 3, 3), (4,)]),
    "conv1d_groups": (lambda x, w: F.conv1d(x, w, groups=2), [(2, 4, 10), (6, 2, 3)]),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2), [(1, 3, 5, 5), (3, 2, 3, 3)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (16,), w, b), [(4, 7, 16), (16,), (16,)]),
    "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), [(3, 4, 5, 5), (4,), (4,)]),
    "batch_norm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), [(6, 3, 4), (3,), (3,)]),
    "softmax": (lambda x: F.softmax(x, -1), [(5, 9)]),
    "log_softmax": (lambda x: F.log_softmax(x, 1), [(5, 9)]),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), [(4, 33)]),
    "silu": (F.silu, [(4, 33)]),
    "relu": (F.relu, [(4, 33)]),
    "tanh_sigmoid": (lambda x: torch.tanh(x) * torch.sigmoid(x), [(4, 33)]),
    "pow_exp_log": (lambda x: (x.abs() + 1).log().pow(2.5).exp(), [(17,)]),
    "sum_mean": (lambda x: x.sum(0) + x.mean(1, keepdim=True), [(6, 6)]),
    "max_min": (lambda x: x.max(1).values - x.amin(0), [(5, 5)]),
    "cumsum_sort": (lambda x: x.cumsum(0) + x.sort(1).values, [(6, 4)]),
    "cat_stack": (lambda a, b: torch.cat([a, b], 1).sum() + torch.stack([a, b]).prod(), [(3, 4), (3, 4)]),
    "views": (lambda x: x.t().reshape(-1)[::2].unsqueeze(0).expand(3, -1).contiguous(), [(4, 6)]),
    "where_masked_fill": (lambda x: torch.where(x > 0, x, x * 3).masked_fill(x < -1, 0.5), [(5, 7)]),
    "clamp_lerp": (lambda a, b: torch.lerp(a.clamp(-0.5, 0.5), b, 0.3), [(10,), (10,)]),
    "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 3, 8, 4)] * 3),
    "max_pool_avg_pool": (lambda x: F.max_pool2d(x, 2) + F.avg_pool2d(x, 2), [(2, 3, 8, 8)]),
    "adaptive_pool_interpolate": (lambda x: F.interpolate(F.adaptive_avg_pool2d(x, 3), scale_factor=2), [(1, 2, 7, 7)]),
    "mse_l1_loss": (lambda a, b: F.mse_loss(a, b) + F.smooth_l1_loss(a, b), [(4, 5), (4, 5)]),
    "norm_var": (lambda x: torch.linalg.vector_norm(x, dim=1) + x.var(1), [(3, 8)]),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 5)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_forward_and_backward_equal_the_cpu_bitwise(name):
    fn, shapes = OPS[name]
    g = torch.Generator().manual_seed(hash(name) % 1000)
    cpu = [torch.randn(s, generator=g, requires_grad=True) for s in shapes]
    dev = [t.detach().to("neuron").requires_grad_() for t in cpu]
    out_cpu, out_dev = fn(*cpu), fn(*dev)
    _same(out_cpu, out_dev, f"{name} forward")
    grad = torch.randn(out_cpu.shape, generator=g)
    out_cpu.backward(grad)
    out_dev.backward(grad.to("neuron"))
    for i, (a, b) in enumerate(zip(cpu, dev)):
        _same(a.grad, b.grad, f"{name} grad of input {i}")


def test_indexing_embedding_and_cross_entropy_equal_the_cpu():
    g = torch.Generator().manual_seed(3)
    table = torch.randn(10, 6, generator=g, requires_grad=True)
    ids = torch.randint(0, 10, (4, 5), generator=g)
    target = torch.randint(0, 6, (20,), generator=g)
    dev_table = table.detach().to("neuron").requires_grad_()

    def step(t, i, y):
        h = F.embedding(i, t).reshape(20, 6)
        loss = F.cross_entropy(h, y) + h[torch.arange(0, 20, 3, device=h.device)].sum()
        loss = loss + h.gather(1, y[:, None]).sum() + h.index_select(0, y).mean()
        loss = loss + torch.zeros(20, 6, device=h.device).scatter_add(0, y[:, None].expand(-1, 6), h).sum()
        loss.backward()
        return loss

    _same(step(table, ids, target), step(dev_table, ids.to("neuron"), target.to("neuron")), "loss")
    _same(table.grad, dev_table.grad, "embedding grad")


def test_optimizer_steps_equal_the_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    dev = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    dev.load_state_dict(model.state_dict())
    dev.to("neuron")
    opts = [torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(dev.parameters(), lr=1e-2)]
    x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
    for _ in range(3):
        for m, o, (xx, yy) in zip((model, dev), opts, ((x, y), (x.to("neuron"), y.to("neuron")))):
            o.zero_grad()
            F.cross_entropy(m(xx), yy).backward()
            o.step()
    for (name, a), b in zip(model.state_dict().items(), dev.state_dict().values()):
        _same(a, b, name)


def test_in_place_out_and_resizing_out_arguments():
    x = torch.randn(5, 5)
    d = x.to("neuron")
    d.add_(1).mul_(2)
    _same((x + 1) * 2, d, "in place")
    out = torch.empty(0, device="neuron")
    torch.add(d, d, out=out)  # the kernel resizes `out`
    _same(((x + 1) * 2) * 2, out, "out= resized")
    v = d[1:3]
    v.zero_()  # through a view: the base sees it
    assert d.cpu()[1:3].abs().sum().item() == 0


def test_copies_between_devices_keep_values_and_layout():
    x = torch.randn(4, 6)
    d = x.t().to("neuron")
    _same(x.t(), d, "strided copy")
    _same(x.double(), x.to("neuron", torch.float64), "converting copy")
    half = torch.empty(6, 4, device="neuron", dtype=torch.bfloat16)
    half.copy_(x.t())
    _same(x.t().bfloat16(), half, "copy_ into neuron")


def test_data_assignment_moves_a_parameter_between_the_cpu_and_the_device():
    # What Module.to and FSDP2's placement do: param.data = param.to(device).
    p = nn.Parameter(torch.arange(6.0).reshape(2, 3))
    p.data = p.to(NEURON)
    assert p.device == NEURON and p.requires_grad
    assert torch.equal(p.cpu(), torch.arange(6.0).reshape(2, 3))
    p.data = p.cpu()
    assert p.device.type == "cpu"
    x = torch.ones(2, device=NEURON)
    x.data = torch.zeros(3, dtype=torch.int64)
    assert x.device.type == "cpu" and x.dtype == torch.int64 and x.shape == (3,)


def test_pinned_host_memory_stays_pinned():
    # FSDP2's CPU offload keeps shards pinned; a shard is_pinned() denied
    # would be copied again and the optimizer's updates lost.
    t = torch.arange(1000.0).pin_memory()
    assert t.is_pinned() and t[10:].is_pinned() and t.view(10, 100).is_pinned()
    assert torch.equal(t, torch.arange(1000.0))
    assert not torch.ones(3).is_pinned()
    assert torch.equal(t.to(NEURON, non_blocking=True).cpu(), t)


def test_mixing_devices_is_refused():
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but "
                                           r"found at least two devices, neuron:0 and cpu! "
                                           r"\(when running aten::mm\)"):
        torch.ones(2, 2, device="neuron") @ torch.ones(2, 2)
    with pytest.raises(RuntimeError, match="neuron:0 and neuron:1"):
        torch.ones(2, device="neuron:0") + torch.ones(2, device="neuron:1")
    # A 0-dimensional CPU tensor is a number, as on CUDA.
    _same(torch.ones(2) * 3, torch.ones(2, device="neuron") * torch.tensor(3.0), "scalar")


def test_operator_without_any_kernel_says_how_to_run_it():
    x = torch.ones(1, 1, 4, 4, device="neuron")
    grid = torch.zeros(1, 2, 2, 2, device="neuron")
    with pytest.raises(NotImplementedError, match=r"The operator 'aten::cudnn_grid_sampler' has no "
                                                  r"kernel for the neuron device and no CPU kernel"
                                                  r".*\.cpu\(\)"):
        torch.ops.aten.cudnn_grid_sampler(x, grid)


def test_random_numbers_follow_torch_manual_seed_as_on_the_cpu():
    torch.manual_seed(7)
    a = torch.randn(6)
    b = torch.rand(3, 3).bernoulli()
    torch.manual_seed(7)
    _same(a, torch.randn(6, device="neuron"), "randn")
    _same(b, torch.rand(3, 3, device="neuron").bernoulli(), "bernoulli")
    torch.manual_seed(1)
    drop = F.dropout(torch.ones(100), 0.5)
    torch.manual_seed(1)
    _same(drop, F.dropout(torch.ones(100, device="neuron"), 0.5), "dropout")
    state = torch.neuron.get_rng_state()
    r1 = torch.randn(4, device="neuron")
    torch.neuron.set_rng_state(state)
    _same(r1.cpu(), torch.randn(4, device="neuron"), "rng state")


def test_autocast_bfloat16():
    a, b = torch.randn(8, 8, device="neuron"), torch.randn(8, 8, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        c = a @ b
        s = F.softmax(c, -1)
        lin = F.linear(a, b)
    assert c.dtype == torch.bfloat16 and lin.dtype == torch.bfloat16
    assert s.dtype == torch.float32  # softmax runs in float32
    _same(a.cpu().bfloat16() @ b.cpu().bfloat16(), c, "autocast mm")


# --- the simulated clock ------------------------------------------------------

def test_eager_ops_advance_the_compute_clock_by_the_device_model():
    fabric.reset_eager()
    before = fabric.clock()["compute_us"]
    a = torch.randn(512, 512, device="neuron")
    a @ a
    a.t()  # a view: free
    records = fabric.eager_records()
    mm = [r for r in records if r["op"] == "aten::mm"]
    assert len(mm) == 1 and mm[0]["kind"] == "matmul"
    # 512^3 fp32 on the tensor engine: 4 x 4 x 1 instructions of 512 columns,
    # 4x slower for float32, at 2.4 GHz (more than the 3 MiB of HBM traffic
    # takes), plus the DMA's fixed 1.3 us.
    assert mm[0]["modelled_us"] == pytest.approx(4 * 4 * 512 * 4 / 2400 + 1.3, rel=1e-6)
    assert not [r for r in records if r["op"] == "aten::t" or r["op"] == "aten::transpose.int"]
    totals = fabric.eager_totals()
    assert totals["operations"] == len(records)
    assert fabric.clock()["compute_us"] - before == pytest.approx(totals["modelled_us"])
    unlisted = torch.special.i0(torch.rand(100, device="neuron"))  # no Neuron kernel
    assert fabric.eager_records()[-1]["kind"] == "fallback"
    assert fabric.eager_records()[-1]["modelled_us"] > 0  # never free
    del unlisted


def test_chrome_trace_has_a_compute_track(tmp_path):
    import json
    fabric.reset_eager()
    torch.ones(4, device="neuron") + 1
    path = tmp_path / "trace.json"
    fabric.export_chrome_trace(path)
    events = json.loads(path.read_text())["traceEvents"]
    assert {e.get("tid") for e in events if e["ph"] == "X"} == {"rank 0 compute"}
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(e["args"]["allocated_bytes"] > 0 for e in counters)
    assert {e["pid"] for e in events} == {"simulated", "wall"}
    assert any(e["name"] == "aten::add.Tensor" for e in events)


# --- a job ------------------------------------------------------------------

def test_accelerator_agnostic_ddp_script_trains_on_neuron_with_four_ranks():
    """examples/07 names neither Neuron nor torchneuron: the device and the
    backend come from torch.accelerator, as in pytorch/examples."""
    script = os.path.join(SOURCE, "examples/07_accelerator_ddp.py")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([NEURONRUN, "-n", "4", script, "--steps", "6"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "[rank 0]: accelerator neuron, backend neuron, 4 ranks, parameters on neuron:0" in out
    losses = [float(line.split()[-1]) for line in out.splitlines() if " loss " in line]
    assert len(losses) == 6 and losses[-1] < losses[0]
    step_ms = float(out.split("step time ")[1].split()[0])
    assert 0 < step_ms < 100  # modelled: a few hundred microseconds of device work


@pytest.mark.parametrize("mode", ["split", "mixed"])
def test_process_groups_on_the_device(mode):
    """split_group (needs torch.accelerator and a bound device) and a
    per-device backend string."""
    script = os.path.join(SOURCE, "tests/python/scripts/device_groups.py")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    done = subprocess.run([NEURONRUN, "-n", "4", script, mode], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(l for l in done.stdout.splitlines() if l.endswith(f"ok {mode}")) == \
        [f"[rank {r}]: ok {mode}" for r in range(4)]
