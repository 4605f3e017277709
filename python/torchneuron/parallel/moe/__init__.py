"""Mixture-of-Experts layers and expert parallelism (torchneuron.parallel.moe).

    from torchneuron.parallel import moe
    layer = moe.MoE(moe.MoEConfig(dim=64, hidden=128, num_experts=8, top_k=2,
                                  capacity_factor=1.25))
    mesh = moe.expert_parallel_mesh("neuron", ep=4)       # ("dp", "ep", "tp")
    moe.apply_expert_parallel(model, mesh)                # this rank's experts, a2a over "ep"
    loss = task_loss + 0.01 * moe.load_balancing_losses(model)
    loss.backward(); moe.reduce_gradients(model, mesh); opt.step()

router: top-k gating, capacity and dropping, the load-balancing loss;
experts: stacked SwiGLU / GELU experts; all_to_all and dispatch: the
uneven all_to_all_single exchanges; layer: the MoE module;
expert_parallel: the mesh, the split, and which group reduces what.
docs/parallel.md, "Expert parallelism".
"""
from .dispatch import DispatchPlan, ExpertPlacement, combine, dispatch
from .experts import GroupedExperts
from .expert_parallel import (apply_expert_parallel, apply_fully_shard, expert_parallel_mesh,
                              expert_parameters, full_gradients, full_state_dict, mesh_sizes,
                              reduce_gradients, replica_mesh)
from .layer import MoE, MoEConfig, RoutingStats, load_balancing_losses, moe_layers
from .router import Routing, TopKRouter, capacity, load_balancing_loss, priority_positions

__all__ = [
    "DispatchPlan", "ExpertPlacement", "GroupedExperts", "MoE", "MoEConfig", "Routing",
    "RoutingStats", "TopKRouter", "apply_expert_parallel", "apply_fully_shard", "capacity",
    "combine", "dispatch", "expert_parallel_mesh", "expert_parameters", "full_gradients",
    "full_state_dict", "load_balancing_loss", "load_balancing_losses", "mesh_sizes",
    "moe_layers", "priority_positions", "reduce_gradients", "replica_mesh",
]
