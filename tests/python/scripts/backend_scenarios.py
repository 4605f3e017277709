#!/usr/bin/env python3
"""Scenarios for the "neuron" backend that the tests launch in several ways.

    backend_scenarios.py init_methods FILE            # under neuronrun -n 2
    backend_scenarios.py mpi                          # under mpirun -n 2
    backend_scenarios.py peer_dies                    # 2 ranks started by hand
    backend_scenarios.py timeout                      # 2 ranks started by hand
    backend_scenarios.py newer_ops                    # under neuronrun -n N

Each prints "ok ..." lines the tests match; any failed check raises.
"""
import datetime
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import torchneuron


def allreduce_check(label):
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    expected = size * (size + 1) / 2
    assert torch.equal(t, torch.full((1000,), expected)), (label, t[:4])
    print(f"ok {label}: rank {rank}/{size} backend {dist.get_backend()}", flush=True)


def init_methods(path):
    # env:// through torchneuron.init(), which reads neuronrun's variables.
    env = torchneuron.init()
    assert env.launcher == "neuronrun/torchrun", env
    allreduce_check("env")
    fabric_checks()
    rank, size = env.rank, env.world_size
    # tcp://'s port: rank 0 binds its store first (port 0, the kernel's
    # choice: nothing can take it in between) and tells the others; its
    # tcp:// rendezvous then serves from that store (TCPStore's multi-tenancy).
    held, port = None, torch.zeros(1, dtype=torch.int64)
    if rank == 0:
        held = dist.TCPStore("127.0.0.1", 0, size, is_master=True, multi_tenant=True,
                             wait_for_workers=False)
        port[0] = held.port
    dist.broadcast(port, 0)
    tcp_port = int(port.item())
    dist.destroy_process_group()
    dist.init_process_group("neuron", init_method=f"file://{path}", rank=rank, world_size=size)
    allreduce_check("file")
    dist.destroy_process_group()
    dist.init_process_group("neuron", init_method=f"tcp://127.0.0.1:{tcp_port}", rank=rank,
                            world_size=size)
    allreduce_check("tcp")
    dist.destroy_process_group()
    del held


def fabric_checks():
    torchneuron.fabric.reset()
    t = torch.ones(1 << 16)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    records = torchneuron.fabric.records()
    assert [r["op"] for r in records] == ["allreduce", "broadcast"], records
    assert records[0]["bytes"] == 4 << 16 and records[0]["modelled_us"] > 0, records[0]
    totals = torchneuron.fabric.totals()
    assert totals["operations"] == 2, totals
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        torchneuron.fabric.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        assert any(e.get("name", "").startswith("allreduce #") for e in events), events[:3]
    # Compiled graphs advance this rank's compute stream; the next collective
    # arrives after it (the two clocks of docs/architecture.md).
    torchneuron.fabric.reset_clock()
    torchneuron.fabric.reset()
    model = torchneuron.compile(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()))
    model(torch.randn(8, 64))
    compute = torchneuron.fabric.clock()["compute_us"]
    assert compute > 0, torchneuron.fabric.clock()
    dist.all_reduce(torch.ones(4))
    arrival = torchneuron.fabric.records()[-1]["arrival_us"]
    assert arrival >= compute, (arrival, compute)
    gloo = dist.new_group(backend="gloo")
    # Both ranks finish Gloo's connection setup before either may exit
    # (a peer leaving mid-setup fails the other's connectFullMesh).
    dist.barrier(group=gloo)
    try:
        torchneuron.fabric.totals(gloo)
        raise AssertionError("fabric statistics of a gloo group")
    except TypeError as e:
        assert "not a neuron process group" in str(e), e
    # Errors are RuntimeError subclasses naming rank, op and sequence number.
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int16))
        raise AssertionError("int16 allreduce accepted")
    except torchneuron.InvalidUsageError as e:
        assert isinstance(e, RuntimeError)
        assert f"neuron rank {dist.get_rank()}" in str(e) and "allreduce #" in str(e), e
        assert "Short" in str(e), e
    print(f"ok fabric: {totals['operations']} ops, modelled {totals['modelled_us']:.1f} us",
          flush=True)


def mpi():
    env = torchneuron.init()
    assert env.launcher == "openmpi", env
    allreduce_check("mpi")
    dist.destroy_process_group()


def peer_dies():
    # Rank 1 leaves in the middle of the job; rank 0, blocked in a
    # collective, must raise a PeerError naming rank 1 well before the
    # 60 s timeout.
    torchneuron.init(timeout=datetime.timedelta(seconds=60))
    allreduce_check("before")
    if dist.get_rank() == 1:
        time.sleep(0.5)
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 20))
        raise AssertionError("allreduce succeeded without rank 1")
    except torchneuron.NeuronError as e:
        elapsed = time.monotonic() - start
        print(f"ok raised {type(e).__name__} after {elapsed:.1f} s: {e}", flush=True)


def timeout():
    torchneuron.init(timeout=datetime.timedelta(seconds=2))
    allreduce_check("before")
    if dist.get_rank() == 1:
        time.sleep(6)  # skips the collective rank 0 waits in
        return
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        raise AssertionError("allreduce completed without rank 1")
    except torchneuron.CollectiveTimeoutError as e:
        elapsed = time.monotonic() - start
        print(f"ok timed out after {elapsed:.1f} s: {e}", flush=True)


def newer_ops():
    torchneuron.init(timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    # A ring exchange of two messages each way, every rank listing its
    # receives first; large enough to take more than one transport slot.
    n = 1 << 18
    got = [torch.empty(n), torch.empty(3, dtype=torch.int64)]
    ops = [dist.P2POp(dist.irecv, got[0], left), dist.P2POp(dist.irecv, got[1], right),
           dist.P2POp(dist.isend, torch.full((n,), float(rank)), right),
           dist.P2POp(dist.isend, torch.tensor([rank, rank, rank]), left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert torch.equal(got[0], torch.full((n,), float(left))), got[0][:4]
    assert torch.equal(got[1], torch.tensor([right] * 3)), got[1]
    # The coalescing manager's fast paths.
    inputs = [torch.arange(4.0) + 10 * rank + k for k in range(3)]
    outputs = [torch.empty(4 * size) for _ in range(3)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for out, inp in zip(outputs, inputs):
            dist.all_gather_into_tensor(out, inp)
    cm.wait()
    for k, out in enumerate(outputs):
        want = torch.cat([torch.arange(4.0) + 10 * r + k for r in range(size)])
        assert torch.equal(out, want), (k, out)
    shards = [torch.empty(2) for _ in range(3)]
    with dist._coalescing_manager(device=torch.device("cpu")):
        for k, shard in enumerate(shards):
            dist.reduce_scatter_tensor(shard, torch.arange(2.0 * size) * (rank + 1) + k)
    total = size * (size + 1) / 2
    for k, shard in enumerate(shards):
        want = (torch.arange(2.0 * size) * total + k * size)[2 * rank:2 * rank + 2]
        assert torch.equal(shard, want), (k, shard, want)
    # A window with a collective the manager does not capture and a send /
    # receive pair: its work completes after both, though the pair is done
    # long before the collective (rank 2 joins it 2 s late).
    exchange = torch.full((4,), float(rank))
    if rank == 2:
        time.sleep(2)
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        a2a_out = torch.empty(size)
        a2a = dist.all_to_all_single(a2a_out, torch.full((size,), float(rank)), async_op=True)
        if rank < 2:
            dist.isend(exchange.clone(), 1 - rank)
            dist.irecv(exchange, 1 - rank)
    cm.wait()
    assert a2a.is_completed(), "the window's work completed before its all_to_all"
    assert torch.equal(a2a_out, torch.arange(float(size))), a2a_out
    if rank < 2:
        assert torch.equal(exchange, torch.full((4,), float(1 - rank))), exchange
    # Sparse allreduce (sparse gradients): the sum of every rank's COO
    # tensor, duplicates across ranks added; a dense reference.
    def sparse_of(r):
        i = torch.tensor([[r % 3, 4, 7][:2 + r % 2], [1, r, 2][:2 + r % 2]])
        v = torch.arange(1.0, 3.0 + r % 2) * (r + 1)
        return torch.sparse_coo_tensor(i, v, (8, 5))
    mine = sparse_of(rank)
    dist.all_reduce(mine)
    dense = sum(sparse_of(r).to_dense() for r in range(size))
    assert mine.is_sparse and torch.equal(mine.to_dense(), dense), (mine, dense)
    # shutdown() drains and stops the group; what comes later is refused.
    dist.barrier()
    dist.group.WORLD.shutdown()
    try:
        dist.all_reduce(torch.ones(1))
        raise AssertionError("an allreduce after shutdown() ran")
    except torchneuron.InvalidUsageError as e:
        assert "allreduce: the backend was shut down" in str(e), e
    print(f"ok newer ops: rank {rank}/{size}", flush=True)


if __name__ == "__main__":
    scenario = sys.argv[1]
    {"init_methods": lambda: init_methods(sys.argv[2]),
     "mpi": mpi, "peer_dies": peer_dies, "timeout": timeout,
     "newer_ops": newer_ops}[scenario]()
