"""What PyTorch's own distributed tests and scripts ask of the "neuron"
device beyond operators (issue 45): storages made on the device (no crash:
made, cloned, resized, saved, loaded, deep-copied), fused optimizers with a
CPU learning-rate tensor, torch.accelerator's memory calls, a generator
with CUDA's seed-and-offset state (fork_rng, DTensor's tracker),
scaled_dot_product_attention through an op DTensor shards, and a send to
this rank itself in batch_isend_irecv; one process each, then one 2-rank
job for DTensor random, meta-device FSDP2 and attention under tensor
parallel.
"""
import copy
import io
import os
import subprocess
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python")
sys.path.insert(0, PACKAGE)
os.environ.pop("LOCAL_RANK", None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import torchneuron  # noqa: E402,F401

NEURON = torch.device("neuron", 0)


def run_in_child(code):
    """`code` in a fresh interpreter: a crash there is a failed test here."""
    env = dict(os.environ, PYTHONPATH=PACKAGE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout}{done.stderr}"
    return done.stdout


# --- storages ------------------------------------------------------------------

def test_untyped_storage_made_cloned_and_resized_on_the_device():
    # A child process: before the fix each of these ended the process (SIGSEGV).
    out = run_in_child("""
import torch, torchneuron
s = torch.UntypedStorage(64, device="neuron")
assert s.device == torch.device("neuron", 0) and s.nbytes() == 64
s.fill_(7)
c = s.clone()
assert c.device.type == "neuron" and c.data_ptr() != s.data_ptr()
assert bytes(c.cpu()) == bytes([7] * 64)
t = torch.arange(6.0, device="neuron")
u = t.untyped_storage().clone()
assert torch.equal(torch.tensor([], device="neuron").set_(u).view(torch.float32).cpu(),
                   torch.arange(6.0))
u.resize_(48)
assert u.nbytes() == 48 and bytes(u.cpu())[:24] == bytes(t.untyped_storage().cpu())
print("ok")
""")
    assert out.strip() == "ok"


def test_save_and_load_of_neuron_tensors_and_deepcopy_of_a_model():
    t = torch.randn(3, 5).to(NEURON)
    buffer = io.BytesIO()
    torch.save({"t": t, "view": t[1:]}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["t"].device == NEURON and torch.equal(loaded["t"].cpu(), t.cpu())
    assert loaded["view"].untyped_storage().data_ptr() == loaded["t"].untyped_storage().data_ptr()
    buffer.seek(0)
    on_cpu = torch.load(buffer, map_location="cpu")
    assert on_cpu["t"].device.type == "cpu" and torch.equal(on_cpu["t"], t.cpu())
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(NEURON)
    twin = copy.deepcopy(model)
    for p, q in zip(model.parameters(), twin.parameters()):
        assert q.device == NEURON and torch.equal(p.cpu(), q.cpu())
        assert p.data_ptr() != q.data_ptr()


# --- fused optimizers ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_fused_optimizers_take_a_one_element_cpu_lr_tensor(name):
    torch.manual_seed(0)
    cpu_model = nn.Linear(6, 3)
    model = copy.deepcopy(cpu_model).to(NEURON)
    kinds = [(model, NEURON, True), (cpu_model, "cpu", False)]
    for m, device, fused in kinds:
        opt = getattr(torch.optim, name)(m.parameters(), lr=torch.tensor([0.1]), fused=fused)
        for step in range(3):
            x = torch.full((2, 6), float(step + 1), device=device)
            m(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach())


def test_a_cpu_tensor_of_more_elements_is_still_refused():
    p = torch.zeros(3, device=NEURON)
    with pytest.raises(RuntimeError, match=r"neuron:0 and cpu! \(when running "
                                           r"aten::_fused_adam_.tensor_lr\)"):
        torch._fused_adam_([p], [torch.ones(3, device=NEURON)], [torch.zeros(3, device=NEURON)],
                           [torch.zeros(3, device=NEURON)], [],
                           [torch.zeros((), device=NEURON)], lr=torch.tensor([0.1, 0.2]),
                           beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False,
                           maximize=False)


# --- torch.accelerator's memory calls ---------------------------------------------

def test_torch_accelerator_memory_calls_read_the_devices_figures():
    torch.accelerator.empty_cache()
    base = torch.accelerator.memory_allocated()
    assert base == torch.neuron.memory_allocated()
    x = torch.empty(1000, dtype=torch.uint8, device="neuron")  # 1024 B in the small pool
    y = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")  # 4 MiB in the large pool
    assert torch.accelerator.memory_allocated() == base + 1024 + (4 << 20)
    stats = torch.accelerator.memory_stats()
    mine = torch.neuron.memory_stats()
    assert stats and all(mine[k] == v for k, v in stats.items()), \
        {k: (v, mine.get(k)) for k, v in stats.items() if mine.get(k) != v}
    assert stats["allocated_bytes.small_pool.current"] >= 1024
    assert stats["allocated_bytes.large_pool.current"] >= 4 << 20
    assert stats["requested_bytes.all.current"] - torch.neuron.memory_stats()[
        "allocated_bytes.all.current"] <= 0
    del x, y
    assert torch.accelerator.memory_allocated() == base
    assert torch.accelerator.memory_reserved() >= base + 1024 + (4 << 20)  # cached
    peak = torch.accelerator.max_memory_allocated()
    assert peak == torch.neuron.max_memory_allocated() >= base + 1024 + (4 << 20)
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.neuron.max_memory_allocated() == base
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_reserved() == torch.neuron.memory_reserved() == base
    torch.accelerator.reset_accumulated_memory_stats()
    assert torch.accelerator.memory_stats()["num_device_alloc"] == 0
    free, total = torch.accelerator.get_memory_info()
    assert total == torch.neuron.get_device_properties().total_memory
    assert free == total - torch.neuron.memory_reserved()


# --- the generator: seed and offset ------------------------------------------------

def test_the_rng_state_is_a_seed_and_an_offset_as_on_cuda():
    torch.manual_seed(11)
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    assert state[:8].view(torch.int64).item() == 11 and state[8:].view(torch.int64).item() == 0
    torch.randn(48, device="neuron")  # a float32 normal_ of 16k elements: 16k words
    assert torch.neuron.get_rng_state()[8:].view(torch.int64).item() == 48
    torch.rand(5, device="neuron")  # uniform_: a word each
    assert torch.neuron.get_rng_state()[8:].view(torch.int64).item() == 53


def test_a_state_draws_the_same_numbers_again_and_offsets_name_positions():
    torch.manual_seed(3)
    cpu = torch.rand(100)
    torch.manual_seed(3)
    first = torch.neuron.get_rng_state()
    a = torch.rand(100, device="neuron").cpu()
    assert torch.equal(a, cpu)  # still the CPU's numbers
    torch.neuron.set_rng_state(first)
    assert torch.equal(torch.rand(100, device="neuron").cpu(), a)
    # An offset never seen: the engine moved there from the seed.
    jump = first.clone()
    jump[8:] = torch.tensor([60], dtype=torch.int64).view(torch.uint8)
    torch.neuron.set_rng_state(jump)
    assert torch.equal(torch.rand(40, device="neuron").cpu(), cpu[60:])
    # The same state in another process (no history) draws the same.
    out = run_in_child(f"""
import torch, torchneuron
torch.neuron.set_rng_state(torch.tensor({jump.tolist()}, dtype=torch.uint8))
print(torch.rand(3, device="neuron").tolist())
""")
    assert eval(out) == cpu[60:63].tolist()


def test_fork_rng_on_the_device_restores_its_state():
    torch.manual_seed(5)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        inside = torch.randn(8, device="neuron").cpu()
    after = torch.randn(8, device="neuron").cpu()
    assert torch.equal(inside, after)


def test_dropout_draws_from_the_devices_generator():
    x = torch.ones(256, device="neuron")
    torch.default_generator.manual_seed(1)
    torch.neuron.manual_seed(4)
    a = F.dropout(x, 0.5)
    torch.default_generator.manual_seed(2)  # the CPU's generator plays no part
    torch.neuron.manual_seed(4)
    assert torch.equal(F.dropout(x, 0.5).cpu(), a.cpu())
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        inside = F.dropout(x, 0.5)
    assert torch.equal(F.dropout(x, 0.5).cpu(), inside.cpu())


# --- scaled_dot_product_attention -------------------------------------------------

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("causal,mask", [(True, False), (False, True)])
def test_attention_runs_efficient_attention_with_the_cpus_numbers(causal, mask):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    bias = torch.randn(6, 6, generator=g) if mask else None
    grad = torch.randn(2, 4, 6, 8, generator=g)
    results = []
    for device in ("cpu", NEURON):
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        with Ops() as ops:
            out = F.scaled_dot_product_attention(
                *leaves, attn_mask=None if bias is None else bias.to(device), is_causal=causal)
            out.backward(grad.to(device))
        results.append((out, [t.grad for t in leaves], ops.names))
    (cpu_out, cpu_grads, cpu_ops), (out, grads, ops) = results
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in cpu_ops
    assert "aten._scaled_dot_product_efficient_attention.default" in ops, ops
    assert "aten._scaled_dot_product_efficient_attention_backward.default" in ops, ops
    assert torch.equal(out.cpu(), cpu_out)  # the CPU's flash kernel, bit for bit
    for a, b in zip(grads, cpu_grads):
        assert torch.equal(a.cpu(), b)


def test_attention_with_dropout_decomposes_as_on_the_cpu():
    q = torch.randn(1, 2, 4, 8, device=NEURON)
    with Ops() as ops:
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    assert not any("efficient" in n or "flash" in n for n in ops.names), ops.names


# --- batch norm in mixed precision (FSDP2's test_norm_modules) ----------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 6), (3, 6, 5, 5)])
def test_batch_norm_takes_low_precision_parameters_beside_fp32_statistics(dtype, shape):
    """As CUDA's kernel: computed in fp32, output and gradients in their
    tensors' dtypes, statistics updated in fp32. The reference is the CPU's
    kernel with the (rounded) parameters in fp32, a mix it takes."""
    torch.manual_seed(0)
    x, grad = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    w, b = torch.randn(6).to(dtype), torch.randn(6).to(dtype)
    stats = (torch.randn(6), torch.rand(6) + 0.5)

    def run(device, param_dtype):
        xs = x.to(device).requires_grad_()
        ws = w.to(device, param_dtype).requires_grad_()
        bs = b.to(device, param_dtype).requires_grad_()
        mean, var = (s.to(device).clone() for s in stats)
        y = F.batch_norm(xs, mean, var, ws, bs, training=True)
        y.backward(grad.to(device))
        evaluated = F.batch_norm(xs.detach(), mean, var, ws.detach(), bs.detach())
        return [t.cpu() for t in (y, xs.grad, ws.grad, bs.grad, mean, var, evaluated)]

    got = run(NEURON, dtype)
    want = run("cpu", torch.float32)
    assert [t.dtype for t in got[:4]] == [dtype] * 4 and got[4].dtype == torch.float32
    for name, g, r in zip(("out", "grad_input", "grad_weight", "grad_bias", "mean", "var",
                           "eval out"), got, want):
        assert torch.equal(g, r.to(g.dtype)), name
    with pytest.raises(RuntimeError, match="expected scalar type"):
        F.batch_norm(x, stats[0].clone(), stats[1].clone(), w, b, training=True)  # the CPU refuses


# --- groups of two backends ----------------------------------------------------------

def test_a_group_of_gloo_for_the_cpu_and_neuron_for_the_device_defaults_to_neuron(tmp_path):
    # DTensorTestBase makes its groups as "cpu:gloo,neuron:neuron". torch means such
    # a group's default to be the plugin's (CUSTOM), but compares the plugin's
    # upper-case name with the map's lower-case one, so the default stayed
    # UNDEFINED: the group was named "undefined" and destroy_process_group()
    # warned "No backend of type 0 found for Process Group with name undefined".
    done = subprocess.run([sys.executable, "-c", f"""
import torch, torch.distributed as dist, torchneuron
dist.init_process_group("cpu:gloo,neuron:neuron", init_method="file://{tmp_path}/store",
                        rank=0, world_size=1)
sub = dist.new_group([0], backend="cpu:gloo,neuron:neuron")
for pg in (dist.group.WORLD, sub):
    assert pg.name() == "custom", pg.name()
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t, group=pg)
    c = torch.ones(2)
    dist.all_reduce(c, group=pg)
    assert t.sum().item() == 3 and c.sum().item() == 2
dist.destroy_process_group()
print("ok")
"""], env=dict(os.environ, PYTHONPATH=PACKAGE), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    assert "No backend of type" not in done.stderr, done.stderr


TORCHRUN_STORE = """
import datetime, torch.distributed as dist, torchneuron
store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
dist.init_process_group("neuron", store=store, rank=0, world_size=1)
dist.destroy_process_group()
print("ok")
"""


@pytest.mark.parametrize("secret", [None, "a-job-secret-of-more-than-16-bytes", "short"])
def test_a_tcpstore_without_a_secret_is_warned_about_once(secret):
    """As torchrun starts a job: torch's TCPStore, which anyone reaching its
    port may read. Without a secret the backend says so; with one it keeps
    the transport's token out of the store (tcp_transport_test.cc checks
    that) and says nothing; a guessable secret is refused."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NEURON_JOB_SECRET", "NEURON_RDZV_SECRET", "NEURON_STORE_ENDPOINT")}
    env["PYTHONPATH"] = PACKAGE
    if secret is not None:
        env["NEURON_JOB_SECRET"] = secret
    done = subprocess.run([sys.executable, "-c", TORCHRUN_STORE], env=env, capture_output=True,
                          text=True, timeout=120)
    if secret == "short":
        assert done.returncode != 0 and "$NEURON_JOB_SECRET" in done.stderr, done.stderr
        return
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    warned = done.stderr.count("TCPStore without authentication")
    assert warned == (1 if secret is None else 0), done.stderr


# --- a message to this rank itself in batch_isend_irecv --------------------------

def test_batch_isend_irecv_takes_a_send_to_this_rank_itself(tmp_path):
    # PyTorch's pipeline schedules (PipelineScheduleMulti with two adjacent
    # stages on one rank: pipelining/test_schedule_multiproc.py's V-shaped and
    # unbalanced schedules) send a stage's output to the next stage on the same
    # rank in one batch with its receive, as NCCL takes in a group. Each receive
    # from itself takes the send of its tag, in order; a half alone is refused.
    done = subprocess.run([sys.executable, "-c", f"""
import torch, torch.distributed as dist, torchneuron
dist.init_process_group("neuron", init_method="file://{tmp_path}/store", rank=0, world_size=1)
dev = torch.device("neuron", 0)
a = torch.arange(4.0, device=dev)
b = torch.arange(6.0, device=dev) * 2
ra = torch.zeros(4, device=dev)
rb = torch.zeros(3, 2, device=dev).t()  # a strided receive
ops = [dist.P2POp(dist.irecv, rb, 0, tag=1), dist.P2POp(dist.irecv, ra, 0),
       dist.P2POp(dist.isend, a, 0), dist.P2POp(dist.isend, b.view(2, 3), 0, tag=1)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
assert torch.equal(ra.cpu(), torch.arange(4.0)), ra
assert torch.equal(rb.cpu(), (torch.arange(6.0) * 2).view(2, 3)), rb
for ops, words in (([dist.P2POp(dist.irecv, ra, 0)], "has no send to this rank"),
                   ([dist.P2POp(dist.isend, a, 0)], "has no receive from this rank"),
                   ([dist.P2POp(dist.isend, a, 0), dist.P2POp(dist.irecv, rb, 0)],
                    "bytes but its receive expects")):
    try:
        dist.batch_isend_irecv(ops)
    except RuntimeError as e:
        assert words in str(e), str(e)
    else:
        raise AssertionError("no error: " + words)
try:  # outside a batch it would wait for itself (torch's dist.send refuses it first)
    dist.group.WORLD.send([a], 0, 0).wait()
except RuntimeError as e:
    assert "a message to itself is taken only in batch_isend_irecv" in str(e), str(e)
else:
    raise AssertionError("a send to itself outside a batch went through")
dist.destroy_process_group()
print("ok")
"""], env=dict(os.environ, PYTHONPATH=PACKAGE), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


# --- 2 ranks: DTensor random, meta-device FSDP2, attention under TP ------------

def test_dtensor_random_meta_init_fsdp2_and_tp_attention_on_two_ranks():
    script = os.path.join(SOURCE, "tests/python/scripts/dtensor_device_parity.py")
    done = subprocess.run([NEURONRUN, "-n", "2", script], capture_output=True, text=True,
                          timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "[rank 0]: dtensor device parity: 3 cases ok" in out, out
    assert "sharded init equals one device's" in out and "equals the CPU init" in out, out
    assert "No backend of type" not in out, out
