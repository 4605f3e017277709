"""torchneuron.parallel.moe: the router's capacity and dropping on a hand-made
case, the load-balancing loss against a hand computation, the layer against
a token-by-token loop (one process); then two jobs under neuronrun: expert
parallelism with data parallelism (by hand and FSDP2) and with tensor
parallelism of the experts, against one process, and the refused layouts
(tests/python/scripts/moe_parity.py)."""
import math
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
from torchneuron.parallel import moe  # noqa: E402

SCRIPT = os.path.join(os.environ["NEURON_SOURCE_DIR"], "tests/python/scripts/moe_parity.py")


def test_capacity_drops_later_choices_then_later_tokens():
    # 4 tokens, top-2 of 3 experts, factor 0.75: capacity ceil(0.75 * 4 * 2 / 3) = 2.
    router = moe.TopKRouter(dim=4, num_experts=3, top_k=2, capacity_factor=0.75)
    logits = torch.tensor([[3.0, 2, 0], [3, 0, 2], [3, 2, 0], [2, 3, 0]])
    r = router.decide(logits, 4)
    assert r.capacity == 2
    assert r.experts.tolist() == [[0, 1], [0, 2], [0, 1], [1, 0]]
    # Priority (choice, token): expert 0's first choices t0, t1 fill it, so t2's
    # first choice and t3's second are dropped; expert 1 takes t3 (a first
    # choice) and t0's second choice before t2's.
    assert moe.priority_positions(r.experts, 3).tolist() == [[0, 1], [1, 0], [2, 2], [0, 3]]
    assert r.kept.tolist() == [[True, True], [True, True], [False, False], [True, False]]
    assert r.dropped() == 3
    assert r.tokens_per_expert(3).tolist() == [2, 2, 1]
    # Mixtral's weights: the top-2 probabilities renormalised (logits 1 apart).
    expected = torch.tensor([1 / (1 + math.exp(-1)), 1 / (1 + math.exp(1))])
    torch.testing.assert_close(r.weights, expected.expand(4, 2))
    unlimited = moe.TopKRouter(4, 3, 2).decide(logits, 4)
    assert unlimited.capacity is None and bool(unlimited.kept.all())
    assert moe.capacity(10, 8, 2, 1.25) == 4  # ceil(1.25 * 10 * 2 / 8) = ceil(3.125)


def test_load_balancing_loss_is_e_times_sum_f_p():
    probs = torch.tensor([[0.7, 0.3], [0.6, 0.4], [0.2, 0.8], [0.9, 0.1]], requires_grad=True)
    experts = torch.tensor([[0], [0], [1], [0]])
    # f = (3/4, 1/4), P = (0.6, 0.4): 2 * (0.75 * 0.6 + 0.25 * 0.4) = 1.1
    loss = moe.load_balancing_loss(probs, experts, 2)
    torch.testing.assert_close(loss, torch.tensor(1.1))
    loss.backward()  # d/dp[n, i] = E * f_i / N, f not differentiated
    torch.testing.assert_close(probs.grad, torch.tensor([[0.375, 0.125]]).expand(4, 2))
    # Top-2 of 3: f counts the N * k assignments; uniform routing gives 1.
    uniform = torch.full((3, 3), 1 / 3)
    two = torch.tensor([[0, 1], [1, 2], [2, 0]])
    torch.testing.assert_close(moe.load_balancing_loss(uniform, two, 3), torch.tensor(1.0))


def naive_moe(layer, x):
    """Each token's output token by token: the sum over its kept choices of
    weight x expert(token)."""
    r = layer.router(x)
    e, out = layer.experts, torch.zeros_like(x)
    for i in range(x.shape[0]):
        for j in range(r.experts.shape[1]):
            if r.kept[i, j]:
                k = r.experts[i, j]
                h = x[i] @ e.w1[k]
                h = F.silu(h) * (x[i] @ e.w3[k]) if e.activation == "swiglu" else F.gelu(h)
                out[i] += r.weights[i, j] * (h @ e.w2[k])
    return out, r


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
@pytest.mark.parametrize("static_rows", [False, True])
def test_layer_equals_a_token_by_token_loop(activation, static_rows):
    torch.manual_seed(0)
    layer = moe.MoE(moe.MoEConfig(dim=8, hidden=16, num_experts=4, top_k=2,
                                  capacity_factor=0.5, activation=activation,
                                  static_rows=static_rows))
    x = torch.randn(3, 8, 8)
    y = layer(x)
    expected, r = naive_moe(layer, x.reshape(-1, 8))
    assert r.dropped() > 0 and bool((~r.kept).all(dim=1).any())  # a token loses both
    torch.testing.assert_close(y, expected.view(3, 8, 8))
    assert layer.stats.dropped == r.dropped()
    assert layer.stats.tokens_per_expert.tolist() == r.tokens_per_expert(4).tolist()
    torch.testing.assert_close(layer.aux_loss, r.aux_loss)


def test_the_predicted_decoders_static_layer_equals_the_moe_layer():
    # torchneuron.models.decoder_moe (what neuronrun predict captures: the
    # dispatch padded to capacity) routes, drops and computes as moe.MoE.
    from torchneuron.models.decoder import DecoderConfig
    from torchneuron.models.decoder_moe import MoEFeedForward
    torch.manual_seed(0)
    cfg = DecoderConfig(hidden=16, heads=2, kv_heads=2, ffn_hidden=24, experts=4, top_k=2,
                        capacity_factor=0.75)
    static = MoEFeedForward(cfg)
    layer = moe.MoE(moe.MoEConfig(dim=16, hidden=24, num_experts=4, top_k=2,
                                  capacity_factor=0.75))
    layer.router.gate.weight.data.copy_(static.gate.weight.data)
    for name in ("w1", "w2", "w3"):
        getattr(layer.experts, name).data.copy_(getattr(static.experts, name).data)
    x = torch.randn(8, 2, 16)
    y, expected = static(x), layer(x)
    assert layer.stats.dropped > 0
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    torch.testing.assert_close(static.aux_loss, layer.aux_loss)
    y.square().sum().backward()
    expected.square().sum().backward()
    torch.testing.assert_close(static.gate.weight.grad, layer.router.gate.weight.grad)
    torch.testing.assert_close(static.experts.w2.grad, layer.experts.w2.grad)


def test_bad_configurations_are_refused_naming_the_values():
    with pytest.raises(ValueError, match=r"top_k 5 must be between 1 and num_experts 4"):
        moe.MoE(moe.MoEConfig(dim=8, hidden=8, num_experts=4, top_k=5))
    with pytest.raises(ValueError, match=r"top_k 0 must be between 1 and num_experts 4"):
        moe.TopKRouter(8, 4, 0)
    with pytest.raises(ValueError, match=r"capacity_factor must be positive .* got 0"):
        moe.TopKRouter(8, 4, 2, capacity_factor=0)
    with pytest.raises(ValueError, match=r"activation 'relu' is not one of"):
        moe.GroupedExperts(4, 8, 8, activation="relu")
    with pytest.raises(ValueError, match=r"static_rows .* needs a capacity_factor"):
        moe.MoE(moe.MoEConfig(dim=8, hidden=8, static_rows=True))
    with pytest.raises(ValueError, match=r"no MoE layer of the model has run a forward"):
        moe.load_balancing_losses(moe.MoE(moe.MoEConfig(dim=8, hidden=8)))


def run(n, *args):
    proc = subprocess.run([NEURONRUN, "-n", str(n), SCRIPT, "--refusals", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "returned a view tensor" not in proc.stderr, proc.stderr  # FSDP2's warning
    return proc.stdout


def cases(out):
    """Each case's line (the script asserts losses, first gradients and
    final parameters against one process; this checks they all ran)."""
    return dict(re.findall(r"\[rank 0\]: moe parity (\S+) on neuron/neuron: (.*)$", out, re.M))


def test_dp_x_ep_on_2_ranks_equals_one_process():
    out = run(2)
    assert "[rank 0]: moe parity: 4 layouts refused on 2 ranks" in out, out
    found = cases(out)
    assert sorted(found) == ["dp2", "ep2", "ep2-fsdp2"], out
    for line in found.values():
        assert "15 gradients and 15 tensors equal" in line and "239 assignments dropped" in line
    assert "[rank 0]: moe parity: 3 cases ok on 2 ranks, neuron/neuron" in out, out


def test_dp_x_ep_and_ep_x_tp_on_4_ranks_equal_one_process():
    out = run(4)
    assert "[rank 0]: moe parity: 4 layouts refused on 4 ranks" in out, out
    found = cases(out)
    assert sorted(found) == sorted(["dp2xep2", "dp2xep2-fsdp2", "ep4", "ep4-one-token",
                                    "ep2xtp2", "ep2xtp2-fsdp2"]), out
    assert "dp 1 x ep 2 x tp 2 FSDP2" in found["ep2xtp2-fsdp2"]
    # One token per rank: ranks send nothing to some peers, and receive nothing.
    zero = re.search(r"; (\d+) zero splits", found["ep4-one-token"])
    assert zero and int(zero.group(1)) > 0, found["ep4-one-token"]
    assert "[rank 0]: moe parity: 6 cases ok on 4 ranks, neuron/neuron" in out, out


def test_example_09_trains_with_expert_parallelism_and_reports_the_all_to_all():
    example = os.path.join(os.environ["NEURON_SOURCE_DIR"], "examples/09_moe_gpt.py")
    proc = subprocess.run([NEURONRUN, "-n", "2", example, "--ep", "2", "--steps", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert ("[rank 0]: MoE GPT: 0.46M parameters (0.17M active per token), 2 layers of top-2 "
            "of 8 experts, capacity factor 1.25; 2 ranks = dp 1 x ep 2 x tp 1 on neuron, "
            "backend neuron") in out, out
    steps = re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+), wall [\d.]+ ms, dropped \d+ of "
                       r"2048 assignments, modelled Trainium2 step ([\d.]+) us, all-to-all "
                       r"([\d.]+) us \(([\d.]+)%\)", out)
    assert len(steps) == 3, out
    for _, modelled, a2a, share in steps:
        assert 0 < float(a2a) < float(modelled)
        assert abs(float(share) - 100 * float(a2a) / float(modelled)) < 0.1
    assert re.search(r"\[rank 0\]: training: loss [\d.]+ -> [\d.]+ over 3 steps \(falls\)",
                     out), out
