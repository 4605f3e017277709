"""Expert parallelism over an upstream DeviceMesh, composed with data
parallelism (by hand or FSDP2) and tensor parallelism of the experts.

    mesh = expert_parallel_mesh("neuron", ep=4)          # ("dp", "ep", "tp"): 2 x 4 x 1 on 8
    apply_expert_parallel(model, mesh)                   # this rank's experts, a2a over "ep"
    # either: loss.backward(); reduce_gradients(model, mesh); opt.step()
    # or:     apply_fully_shard(model, mesh, blocks)     # FSDP2 (after expert parallelism)

The layout is torchtitan's and Megatron-LM's: expert parallelism is carved
out of data parallelism. The batch is split over dp x ep (every rank of
one ep group holds different tokens); the tp ranks of one (dp, ep) cell
hold the same tokens. Ep rank r holds experts [r * E / ep, (r + 1) * E / ep)
of every MoE layer, tp rank t slice t of each expert's hidden dimension.
Every other parameter is replicated over dp x ep (and over tp, unless the
caller splits it with parallelize_module).

What is reduced where (the gradient of the mean loss over the dp x ep
shards of the batch):
- an expert's gradient already sums every ep rank's tokens through the
  all-to-all's backward; it is summed over "dp" (the ranks holding the same
  experts: its replicas) and divided by dp x ep;
- every other gradient is summed over the flattened "dp" x "ep" group and
  divided by dp x ep;
- nothing is reduced over "tp": the experts' slices are disjoint, and a
  replicated parameter's gradient is the same on every tp rank (the experts'
  input is copied to tp with an all-reduce in backward, their output
  all-reduced in forward: Megatron's f and g).
reduce_gradients does this with all-reduces; apply_fully_shard with FSDP2,
as torchtitan does: the experts fully sharded over "dp" with a gradient
divide factor of dp x ep, the rest over the flattened "dp_ep" mesh.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from .experts import GroupedExperts
from .layer import moe_layers

_FLAT = "dp_ep"


def expert_parallel_mesh(device_type, ep, tp=1):
    """A ("dp", "ep", "tp") DeviceMesh over every rank, dp = world / (ep x
    tp) (ranks ordered dp, ep, tp: tp contiguous). ValueError naming the
    sizes when ep x tp does not divide the world size."""
    world = dist.get_world_size()
    if ep < 1 or tp < 1:
        raise ValueError(f"MoE: ep {ep} and tp {tp} must be at least 1")
    if world % (ep * tp):
        raise ValueError(f"MoE: world size {world} is not divisible by ep x tp = "
                         f"{ep} x {tp} = {ep * tp}")
    return init_device_mesh(device_type, (world // (ep * tp), ep, tp),
                            mesh_dim_names=("dp", "ep", "tp"))


def mesh_sizes(mesh):
    """(dp, ep, tp) of `mesh`, 1 for a dimension it lacks; ValueError
    without an "ep" dimension."""
    names = mesh.mesh_dim_names or ()
    if "ep" not in names:
        raise ValueError(f"MoE: the device mesh needs a dimension named 'ep'; it has {names}")
    return tuple(mesh[n].size() if n in names else 1 for n in ("dp", "ep", "tp"))


def replica_mesh(mesh):
    """The mesh over which a non-expert parameter is replicated: "dp" and
    "ep" flattened into one dimension "dp_ep" (just "ep" without "dp")."""
    names = mesh.mesh_dim_names
    if "dp" not in names:
        return mesh["ep"]
    dims = tuple(n for n in names if n in ("dp", "ep"))
    return mesh[dims]._flatten(_FLAT)


def apply_expert_parallel(model, mesh):
    """Makes every MoE layer of `model` hold this rank's experts (ep rank r:
    experts [r * E_local, (r + 1) * E_local), E_local = E / ep; with a "tp"
    dimension of size > 1, hidden slice tp_rank of each) and exchange
    tokens over mesh["ep"]. Call it on the full model (every rank built
    with the same seed), before FSDP2 or an optimizer. ValueError naming
    the values when ep does not divide a layer's experts or tp its hidden
    size."""
    dp, ep, tp = mesh_sizes(mesh)
    ep_rank = mesh["ep"].get_local_rank()
    tp_rank = mesh["tp"].get_local_rank() if tp > 1 else 0
    layers = moe_layers(model)
    if not layers:
        raise ValueError("MoE: apply_expert_parallel found no MoE layer in the model")
    for layer in layers:
        experts = layer.experts
        if experts.num_experts % ep:
            raise ValueError(f"MoE: ep {ep} does not divide num_experts "
                             f"{experts.num_experts}")
        local = experts.num_experts // ep
        experts.keep(ep_rank * local, local, tp_rank, tp)
        layer.placement.ep_group = mesh["ep"].get_group() if ep > 1 else None
        layer.tp_group = mesh["tp"].get_group() if tp > 1 else None
    return model


def expert_parameters(model):
    """The parameters of `model`'s experts (GroupedExperts), in module order."""
    return [p for m in model.modules() if isinstance(m, GroupedExperts)
            for p in m.parameters()]


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _all_reduce_coalesced(grads, group):
    """Sums `grads` over `group` in one all-reduce per dtype (flattened into
    one buffer and copied back: a collective's latency paid once)."""
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in same:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def reduce_gradients(model, mesh):
    """After backward: the gradients of the mean loss over the dp x ep
    shards (module docstring), the experts' summed over "dp" and the rest
    over "dp_ep" (one all-reduce per group and dtype), each divided by
    dp x ep. Collective over the mesh; every rank calls it with the same
    model."""
    dp, ep, _ = mesh_sizes(mesh)
    experts = {id(p) for p in expert_parameters(model)}
    grads = {True: [], False: []}  # is an expert's: local gradients
    for p in model.parameters():
        if p.grad is not None:
            grads[id(p) in experts].append(_local(p.grad))
    groups = {True: mesh["dp"].get_group() if dp > 1 else None,
              False: replica_mesh(mesh).get_group() if dp * ep > 1 else None}
    for is_expert, local in grads.items():
        if local and groups[is_expert] is not None:
            _all_reduce_coalesced(local, groups[is_expert])
        for g in local:
            g.div_(dp * ep)


def apply_fully_shard(model, mesh, modules=(), **kwargs):
    """FSDP2 as torchtitan applies it with expert parallelism: each MoE
    layer's experts fully_shard over mesh["dp"] with gradient divide factor
    dp x ep (reduced with SUM, then scaled: any backend), then each of
    `modules` (e.g. the blocks) and the root over the flattened "dp_ep"
    mesh. `kwargs` go to every fully_shard
    (mp_policy, reshard_after_forward, ...). Needs a "dp" dimension (of
    any size, 1 included). Returns the root."""
    from torch.distributed.fsdp import fully_shard
    dp, ep, _ = mesh_sizes(mesh)
    if "dp" not in mesh.mesh_dim_names:
        raise ValueError("MoE: apply_fully_shard needs a 'dp' mesh dimension (size 1 "
                         f"allowed); the mesh has {mesh.mesh_dim_names}")
    for layer in moe_layers(model):
        fully_shard(layer.experts, mesh=mesh["dp"], **kwargs)
        layer.experts.set_gradient_divide_factor(float(dp * ep))
        # SUM and a separate scaling rather than PREMUL_SUM, which Gloo lacks;
        # not over one rank, where torch 2.13's FSDP2 would then divide twice
        # (its single-rank copy divides, and so does the post-division).
        layer.experts.set_force_sum_reduction_for_comms(dp > 1)
    flat = replica_mesh(mesh)
    for m in modules:
        fully_shard(m, mesh=flat, **kwargs)
    return fully_shard(model, mesh=flat, **kwargs)


def _gather(t, dim, group, size):
    if size == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _whole(name, t, mesh, sizes, is_expert):
    """`t` (a parameter, buffer or gradient of `name`) whole: a DTensor
    gathered; an expert's tensor gathered over "tp" (hidden slices: w2's
    rows, w1's and w3's columns) and "ep" (experts)."""
    _, ep, tp = sizes
    full = (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
    if is_expert:
        hidden_dim = 1 if name.endswith("w2") else 2
        full = _gather(full, hidden_dim, mesh["tp"].get_group() if tp > 1 else None, tp)
        full = _gather(full, 0, mesh["ep"].get_group(), ep)
    return full


def full_state_dict(model, mesh):
    """Every parameter and buffer of `model` whole, as the one-process
    model names them, on every rank (collective): FSDP2's and
    parallelize_module's DTensors gathered, each layer's experts gathered
    over "tp" (hidden slices) and "ep" (experts)."""
    sizes, experts = mesh_sizes(mesh), {id(p) for p in expert_parameters(model)}
    named = list(model.named_parameters()) + list(model.named_buffers())
    return {name: _whole(name, t, mesh, sizes, id(t) in experts) for name, t in named}


def full_gradients(model, mesh):
    """The parameters' gradients whole, as full_state_dict gathers the
    parameters (collective; a parameter without a gradient is left out):
    after reduce_gradients (or FSDP2's backward), the one-process model's
    gradient of the mean loss over the dp x ep shards."""
    sizes, experts = mesh_sizes(mesh), {id(p) for p in expert_parameters(model)}
    return {name: _whole(name, p.grad, mesh, sizes, id(p) in experts)
            for name, p in model.named_parameters() if p.grad is not None}
