#!/usr/bin/env python3
"""PyTorch's own distributed stack on the job's accelerator, against one
process: a user's GPT trained 10 steps with FSDP2, DTensor tensor (and
sequence) parallel, their 2-D combination, torch.distributed.pipelining
(GPipe, 1F1B, Interleaved1F1B) over FSDP2 data parallelism, and a DCP
checkpoint resharded from one layout into another; and torchneuron.parallel
meeting them: its ZeRO stages 1 and 3 on the same model, its initialize()'s
groups as the DeviceMesh FSDP2 x TP run on, and its checkpoints and DCP's
loading into each other.

    neuronrun -n 4 tests/python/scripts/upstream_parity.py             # on "neuron"
    neuronrun -n 4 tests/python/scripts/upstream_parity.py --cpu       # on the CPU, Gloo
    neuronrun -n 8 tests/python/scripts/upstream_parity.py --cases 3d  # pp x dp x tp

The script is written as a user would write it: the device and backend
come from torch.accelerator (or the CPU and Gloo with --cpu), the meshes
from init_device_mesh; from torchneuron only its import and the model
(torchneuron.models.plain_gpt: plain torch.nn layers and the plans), but
in the torchneuron.parallel cases (zero1, zero3, mesh, checkpoint-interop).
Every training case starts from the reference model's weights and data, and
its per-step losses must equal the one-process reference's (computed on the
CPU) within fp32 tolerance (bf16 mixed precision: within bf16's); the
checkpoint cases compare every tensor bitwise. Rank 0 prints one line per
case, then "upstream parity: N cases ok".
"""
import argparse
import math
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_state_dict, set_model_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B)

import torchneuron  # noqa: F401  (registers the "neuron" device and backend)
import torchneuron.parallel as neuron_parallel
from torchneuron.models.plain_gpt import (GPT, Block, PlainGPTConfig, apply_fully_shard,
                                          apply_tensor_parallel, loss_fn, pipeline_stage)

VOCAB, SEQ, LAYERS, BATCH, STEPS = 32, 8, 4, 8, 10
CONFIG = PlainGPTConfig(vocab=VOCAB, seq=SEQ, dim=32, heads=4, layers=LAYERS)


def reference_model():
    torch.manual_seed(0)
    return GPT(CONFIG)


def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-2, foreach=False)


def mean_over(loss, group):
    """The batch's mean loss from each data-parallel rank's mean over its share."""
    t = loss.detach().clone()
    dist.all_reduce(t, group=group)
    return t.item() / dist.get_world_size(group)


def shard_rows(t, mesh_dim):
    return t.chunk(mesh_dim.size())[mesh_dim.get_local_rank()]


def full_cpu(t):
    """A state-dict value whole, on the CPU (a DTensor gathered)."""
    return t.full_tensor().cpu() if hasattr(t, "full_tensor") else t.cpu()


def train(model, x, y, dp_group=None, before_step=None):
    """Per-step losses (the data-parallel mean with `dp_group`);
    `before_step()` runs between backward and the optimizer's step."""
    opt, losses = optimizer(model.parameters()), []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        losses.append(mean_over(loss, dp_group) if dp_group is not None else loss.item())
    return losses


def case_fsdp2(device, mp=False):
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    model = reference_model()
    for layer in model.layers.values():
        layer.checkpointed = not mp  # activation checkpointing under FSDP2
    kwargs = {}
    if mp:
        kwargs = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                    reduce_dtype=torch.float32),
                  "offload_policy": CPUOffloadPolicy(), "reshard_after_forward": False}
    else:
        model.to(device)
    apply_fully_shard(model, mesh["dp"], **kwargs)
    x, y = batch()
    return train(model, shard_rows(x, mesh["dp"]).to(device), shard_rows(y, mesh["dp"]).to(device),
                 mesh["dp"].get_group())


def case_tp(device, sequence_parallel):
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("tp",))
    model = apply_tensor_parallel(reference_model().to(device), mesh["tp"], sequence_parallel)
    x, y = batch()
    return train(model, x.to(device), y.to(device))


def case_fsdp_tp(device):
    mesh = init_device_mesh(device.type, (2, dist.get_world_size() // 2),
                           mesh_dim_names=("dp", "tp"))
    model = apply_fully_shard(apply_tensor_parallel(reference_model().to(device), mesh["tp"], False), mesh["dp"])
    x, y = batch()
    return train(model, shard_rows(x, mesh["dp"]).to(device), shard_rows(y, mesh["dp"]).to(device),
                 mesh["dp"].get_group())


def case_pp(device, schedule, tp=1):
    """Pipeline stages over FSDP2 data parallelism (and tensor parallelism
    inside each stage with tp > 1): pp x dp (x tp)."""
    pp = 2
    dims, names = (pp, dist.get_world_size() // (pp * tp)), ("pp", "dp")
    if tp > 1:
        dims, names = dims + (tp,), names + ("tp",)
    mesh = init_device_mesh(device.type, dims, mesh_dim_names=names)
    pp_rank = mesh["pp"].get_local_rank()
    virtual = 2 if schedule is ScheduleInterleaved1F1B else 1
    stages, modules = [], []
    for s in range(pp_rank, pp * virtual, pp):  # this rank's stages: rank, rank + pp, ...
        m = pipeline_stage(reference_model(), pp * virtual, s).to(device)
        if tp > 1:
            apply_tensor_parallel(m, mesh["tp"], False)
        apply_fully_shard(m, mesh["dp"])
        modules.append(m)
        stages.append(PipelineStage(m, s, pp * virtual, device, group=mesh["pp"].get_group()))
    microbatches = 2
    sched = schedule(stages if virtual > 1 else stages[0], n_microbatches=microbatches,
                     loss_fn=loss_fn)
    x, y = batch()
    x, y = shard_rows(x, mesh["dp"]).to(device), shard_rows(y, mesh["dp"]).to(device)
    opt = optimizer([p for m in modules for p in m.parameters()])
    last = pp_rank == pp - 1
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        per_microbatch = []
        if pp_rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=per_microbatch)
        opt.step()
        # The last stage has the losses: its data-parallel mean, sent to all.
        loss = torch.zeros((), device=device)
        if last:
            loss = torch.stack(per_microbatch).mean().detach()
            loss = torch.tensor(mean_over(loss, mesh["dp"].get_group()), device=device)
        dist.broadcast(loss, group=mesh["pp"].get_group(), group_src=pp - 1)
        losses.append(loss.item())
    return losses


def zero_model(module, stage, offload=False):
    """torchneuron.parallel's own ZeRO over every rank, a unit per block
    (with `offload`, its master shards and optimizer state on the host)."""
    return neuron_parallel.FullyShardedDataParallel(
        module, stage=stage, process_group=dist.group.WORLD,
        wrap_policy=neuron_parallel.module_type_policy(Block),
        cpu_offload=neuron_parallel.CPUOffload() if offload else None)


def rank_rows(device):
    """This rank's rows of the batch."""
    world, rank = dist.get_world_size(), dist.get_rank()
    return tuple(t.chunk(world)[rank].to(device) for t in batch())


def case_zero(device, stage, offload=False):
    """ZeRO, its gradient-norm clipping run every step (at a bound far above
    the norm: the losses stay the reference's)."""
    model = zero_model(reference_model().to(device), stage, offload)
    return train(model, *rank_rows(device), dist.group.WORLD,
                 before_step=lambda: model.clip_grad_norm_(1e9))


def case_mesh(device):
    """FSDP2 x TP on the DeviceMesh of torchneuron.parallel.initialize(tp=2):
    its own groups, as fsdp2xtp's init_device_mesh lays them out."""
    neuron_parallel.initialize(tp=2)
    try:
        default = neuron_parallel.get_device_mesh()  # the accelerator's
        assert default.device_type == torch.accelerator.current_accelerator().type, default
        mesh = neuron_parallel.get_device_mesh(device.type)
        assert mesh.mesh_dim_names == ("pp", "dp", "tp") and mesh.shape == (1, 2, 2), mesh
        assert mesh["dp"].get_group() is neuron_parallel.get_data_parallel_group()
        assert mesh["tp"].get_group() is neuron_parallel.get_tensor_parallel_group()
        model = apply_fully_shard(apply_tensor_parallel(reference_model().to(device), mesh["tp"],
                                                        False), mesh["dp"])
        x, y = batch()
        return train(model, shard_rows(x, mesh["dp"]).to(device),
                     shard_rows(y, mesh["dp"]).to(device), mesh["dp"].get_group())
    finally:
        neuron_parallel.destroy()


def shared_tempdir(prefix):
    """A directory rank 0 makes, its name sent to every rank."""
    shared = [tempfile.mkdtemp(prefix=prefix) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def trained_zero3(device):
    """ZeRO-3 and its module after 2 steps of AdamW."""
    plain = reference_model().to(device)
    model = zero_model(plain, 3)
    opt = optimizer(model.parameters())
    x, y = rank_rows(device)
    for _ in range(2):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return plain, model, opt


def case_checkpoint_interop(device):
    """Model state both ways between torchneuron.parallel's checkpoints and
    DCP: a ZeRO-3 checkpoint into another ZeRO-3 model (load_checkpoint),
    into FSDP2 x TP (load_full_state_dict and set_model_state_dict); that
    model's DCP checkpoint into a ZeRO-3 model (dcp.load of its plain
    module). Returns the tensors checked."""
    plain, zero, opt = trained_zero3(device)
    saved = zero.full_state_dict()
    directory = shared_tempdir("upstream-interop-")
    neuron_parallel.save_checkpoint(directory, plain, parts=[zero], optimizer=opt, step=2)
    torch.manual_seed(9)
    again_plain = GPT(CONFIG).to(device)
    again = zero_model(again_plain, 3)
    neuron_parallel.load_checkpoint(directory, again_plain, parts=[again],
                                    optimizer=optimizer(again.parameters()))
    checks = 0
    for name, value in again.full_state_dict().items():
        torch.testing.assert_close(value.cpu(), saved[name].cpu(), rtol=0, atol=0,
                                   msg=lambda m: f"torchneuron -> ZeRO-3 {name}: {m}")
        checks += 1
    mesh = init_device_mesh(device.type, (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(7)  # other weights: the load must replace them
    target = apply_fully_shard(apply_tensor_parallel(GPT(CONFIG).to(device), mesh["tp"], False),
                               mesh["dp"])
    set_model_state_dict(target, neuron_parallel.load_full_state_dict(directory),
                         options=StateDictOptions(full_state_dict=True))
    loaded = get_model_state_dict(target, options=StateDictOptions(full_state_dict=True))
    for name, value in saved.items():
        torch.testing.assert_close(full_cpu(loaded[name]), value.cpu(), rtol=0, atol=0,
                                   msg=lambda m: f"torchneuron -> FSDP2 x TP {name}: {m}")
        checks += 1
    # And back: the FSDP2 x TP model through DCP into a fresh ZeRO-3 model.
    dcp_dir = shared_tempdir("upstream-interop-dcp-")
    dcp.save({"model": get_model_state_dict(target)}, checkpoint_id=dcp_dir)
    torch.manual_seed(8)
    fresh = GPT(CONFIG).to(device)
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=dcp_dir)
    set_model_state_dict(fresh, state["model"])
    back = zero_model(fresh, 3)
    for name, value in back.full_state_dict().items():
        torch.testing.assert_close(value.cpu(), saved[name].cpu(), rtol=0, atol=0,
                                   msg=lambda m: f"DCP -> torchneuron ZeRO-3 {name}: {m}")
        checks += 1
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(directory)
        shutil.rmtree(dcp_dir)
    return checks


def case_dcp(device):
    """Save an FSDP2 model and its AdamW state over every rank; load them
    into a 2-D FSDP2 x TP layout: every parameter and optimizer state equal."""
    world = dist.get_world_size()
    flat = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    source = apply_fully_shard(reference_model().to(device), flat["dp"])
    opt = optimizer(source.parameters())
    x, y = batch()
    for _ in range(2):
        opt.zero_grad()
        loss_fn(source(shard_rows(x, flat["dp"]).to(device)),
                shard_rows(y, flat["dp"]).to(device)).backward()
        opt.step()
    model_sd, optim_sd = get_state_dict(source, opt)
    directory = shared_tempdir("upstream-dcp-")
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)

    two_d = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(7)  # other weights: the load must replace them
    target = apply_fully_shard(apply_tensor_parallel(GPT(CONFIG).to(device), two_d["tp"], False), two_d["dp"])
    target_opt = optimizer(target.parameters())
    t_model, t_optim = get_state_dict(target, target_opt)
    state = {"model": t_model, "optim": t_optim}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(target, target_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    got_model, got_optim = get_state_dict(target, target_opt)
    checks = 0
    for name, value in model_sd.items():
        torch.testing.assert_close(full_cpu(got_model[name]), full_cpu(value), rtol=0, atol=0,
                                   msg=lambda m: f"dcp parameter {name}: {m}")
        checks += 1
    for name, value in optim_sd["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(full_cpu(got_optim["state"][name][key]), full_cpu(value[key]),
                                       rtol=0, atol=0, msg=lambda m: f"dcp {name}.{key}: {m}")
            checks += 1
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(directory)
    return checks


CASES = {
    "fsdp2": lambda d: case_fsdp2(d),
    "fsdp2-bf16-offload": lambda d: case_fsdp2(d, mp=True),
    "tp": lambda d: case_tp(d, False),
    "tp-sp": lambda d: case_tp(d, True),
    "fsdp2xtp": lambda d: case_fsdp_tp(d),
    "pp-gpipe": lambda d: case_pp(d, ScheduleGPipe),
    "pp-1f1b": lambda d: case_pp(d, Schedule1F1B),
    "pp-interleaved1f1b": lambda d: case_pp(d, ScheduleInterleaved1F1B),
    "3d": lambda d: case_pp(d, Schedule1F1B, tp=2),
    # torchneuron.parallel against them.
    "zero1": lambda d: case_zero(d, 1),
    "zero3-offload": lambda d: case_zero(d, 3, offload=True),
    "mesh": lambda d: case_mesh(d),
}
DEFAULT = [c for c in CASES if c != "3d"] + ["dcp", "checkpoint-interop"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="the CPU and Gloo instead of the accelerator")
    p.add_argument("--cases", default=",".join(DEFAULT),
                   help="comma-separated (default: every case but 3d)")
    args = p.parse_args()
    cases = args.cases.split(",")
    if args.cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        accelerator = torch.accelerator.current_accelerator()
        device = torch.device(accelerator.type, torch.accelerator.current_device_index())
        backend = dist.get_default_backend_for_device(accelerator)
    dist.init_process_group(backend=backend)
    reference = train(reference_model(), *batch())  # one process, on the CPU
    ok = 0
    for name in cases:
        if name == "dcp":
            checks = case_dcp(device)
            if dist.get_rank() == 0:
                print(f"upstream parity dcp on {device.type}/{backend}: FSDP2 x{dist.get_world_size()}"
                      f" -> FSDP2 x TP, {checks} tensors equal", flush=True)
            ok += 1
            continue
        if name == "checkpoint-interop":
            checks = case_checkpoint_interop(device)
            if dist.get_rank() == 0:
                print(f"upstream parity checkpoint-interop on {device.type}/{backend}: ZeRO-3 -> "
                      f"ZeRO-3, -> FSDP2 x TP -> DCP -> ZeRO-3, {checks} tensors equal",
                      flush=True)
            ok += 1
            continue
        losses = CASES[name](device)
        bf16 = "bf16" in name
        torch.testing.assert_close(losses, reference, rtol=2e-2 if bf16 else 1e-5,
                                   atol=2e-2 if bf16 else 1e-5,
                                   msg=lambda m: f"case {name}: losses {losses} against the "
                                                 f"reference {reference}: {m}")
        assert all(math.isfinite(v) for v in losses)
        if dist.get_rank() == 0:
            print(f"upstream parity {name} on {device.type}/{backend}: {STEPS} steps, losses "
                  + " ".join(f"{v:.6f}" for v in losses), flush=True)
        ok += 1
    if dist.get_rank() == 0:
        print(f"upstream parity: {ok} cases ok on {dist.get_world_size()} ranks, "
              f"{device.type}/{backend}; reference " + " ".join(f"{v:.6f}" for v in reference),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
