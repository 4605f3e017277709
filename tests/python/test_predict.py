"""neuronrun predict end to end: the capture, the agreement with a real run,
bad input, a layout that does not fit, and the published rows' errors.

Each prediction starts one Python capture (about 4 s of CPU); the real run
is one 4-rank job of a small decoder.
"""
import os
import re
import subprocess

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
TRN1 = ["--topology", os.path.join(SOURCE, "configs/topologies/trn1-node.textproto"),
        "--device", os.path.join(SOURCE, "configs/devices/neuroncore-v2.textproto")]

TINY = """# a small Llama: grouped-query attention, SwiGLU, RMSNorm, rotary
name: "tiny"
layers: 2
hidden: 64
heads: 4
kv_heads: 2
ffn_hidden: 172
vocab: 256
activation: "swiglu"
norm: "rmsnorm"
position: "rotary"
"""


# The same with a Mixture of Experts: 4 SwiGLU experts of 128, 2 per token.
TINY_MOE = TINY.replace("name: \"tiny\"", "name: \"tiny-moe\"").replace(
    "ffn_hidden: 172", "ffn_hidden: 128") + "experts: 4\ntop_k: 2\ncapacity_factor: 1.25\n"


def predict(*args, timeout=300):
    return subprocess.run([NEURONRUN, "predict", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.textproto"
    path.write_text(TINY)
    return str(path)


def seq_per_s(stdout):
    lines = [line for line in stdout.splitlines() if line.startswith("seq/s: ")]
    assert len(lines) == 1, stdout
    return float(lines[0].split()[1])


def phases(capture_text):
    """name -> (ops, collective kinds) of a StepCapture text proto."""
    out = {}
    for name, body in re.findall(r'phases \{\n  name: "(\w+)"(.*?)\n\}', capture_text, re.S):
        out[name] = (re.findall(r'name: "(aten::[^"]+)"', body),
                     re.findall(r'kind: "(allgather|allreduce|reducescatter)"', body))
    return out


def test_prediction_equals_the_replay_of_a_real_run(tiny, tmp_path):
    # The same small decoder, tp 2 x dp 2, two microbatches, eager: its real
    # run under neuronrun, replayed, against predict's eager pricing.
    trace = str(tmp_path / "trace")
    real = subprocess.run(
        [NEURONRUN, "-n", "4", os.path.join(SOURCE, "tests/python/scripts/decoder_step.py"),
         "--model", tiny, "--tp", "2", "--seq", "32", "--microbatches", "2",
         "--trace-out", trace], capture_output=True, text=True, timeout=300)
    assert real.returncode == 0, real.stderr
    replay = subprocess.run([NEURONRUN, "replay", trace], capture_output=True, text=True,
                            timeout=120)
    assert replay.returncode == 0, replay.stderr
    real_us = float(re.search(r"modelled_step_us: ([0-9.e+]+)", replay.stdout).group(1))
    proc = predict("--model", tiny, "--seq", "32", "--global-batch", "4", "--tp", "2",
                   "--ranks-per-node", "4", "--dtype", "fp32", "--attention", "core",
                   "--pricing", "eager")
    assert proc.returncode == 0, proc.stderr
    predicted_us = 4 / seq_per_s(proc.stdout) * 1e6
    # The real step also flattens its gradients and weights for the update
    # (two concatenations), and its first microbatch adds no gradients.
    assert predicted_us == pytest.approx(real_us, rel=0.02), (predicted_us, real_us)


def test_capture_records_sequence_parallel_collectives_and_recomputation(tiny, tmp_path):
    captures = {}
    for mode in ("none", "full"):
        out = str(tmp_path / f"{mode}.textproto")
        proc = predict("--model", tiny, "--seq", "32", "--global-batch", "8", "--tp", "2",
                       "--ranks-per-node", "8", "--sequence-parallel", "--zero", "1",
                       "--activation-checkpointing", mode, "--capture-out", out)
        assert proc.returncode == 0, proc.stderr
        captures[mode] = open(out).read()
    none, full = phases(captures["none"]), phases(captures["full"])
    assert set(none) == {"embed_forward", "embed_backward", "layer_forward", "layer_backward",
                         "head_forward", "head_backward", "optimizer_62016"}
    # Megatron's sequence parallelism: all-gather before each column-parallel
    # linear (qkv, MLP up), reduce-scatter after each row-parallel one;
    # backward, in reverse: each row-parallel linear all-gathers its output's
    # gradient, each column-parallel one gathers its input again for the
    # weight gradient and reduce-scatters its input's gradient.
    assert none["layer_forward"][1] == ["allgather", "reducescatter"] * 2
    assert none["layer_backward"][1] == ["allgather", "allgather", "reducescatter"] * 2
    # Full checkpointing recomputes the forward inside backward when the
    # first saved activation is needed (after the all-gather of the output's
    # gradient), and only up to what backward needs (PyTorch's non-reentrant
    # checkpoint stops there: the MLP's last reduce-scatter is not run again).
    forward, backward = none["layer_forward"][1], none["layer_backward"][1]
    assert full["layer_backward"][1] == backward[:1] + forward[:-1] + backward[1:]
    assert len(full["layer_backward"][0]) > len(none["layer_backward"][0])
    saved = {m: int(re.search(r"layer_activation_bytes: (\d+)", t).group(1))
             for m, t in captures.items()}
    assert 0 < saved["full"] < saved["none"]
    # Each rank holds half the layer's weights: (4 + 2 * 2) * 16 * 64 / 2 for
    # qkv, 64 * 64 / 2 for o, 3 * 64 * 172 / 2 for the MLP; two norms whole.
    assert "layer_parameters: 22784" in captures["none"]
    assert "aten::mm.default" in none["layer_forward"][0]


def test_a_mixture_of_experts_is_captured_with_its_all_to_alls(tmp_path):
    model = tmp_path / "tiny-moe.textproto"
    model.write_text(TINY_MOE)
    out = tmp_path / "moe.textproto"
    proc = predict("--model", str(model), "--seq", "32", "--global-batch", "8", "--tp", "2",
                   "--ep", "2", "--zero", "1", "--ranks-per-node", "8", "--capture-out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    layer = {name: re.findall(r'kind: "(all\w+)"\n\s+axis: "(\w+)"', body)
             for name, body in re.findall(r'phases \{\n  name: "(\w+)"(.*?)\n\}', text, re.S)}
    # Forward: attention's all-reduce, the dispatch over ep, the experts'
    # all-reduce over tp (their hidden split), the combine over ep; backward
    # the same in reverse.
    assert layer["layer_forward"] == [("allreduce", "tp"), ("alltoall", "ep"),
                                      ("allreduce", "tp"), ("alltoall", "ep")], layer
    assert layer["layer_backward"] == [("alltoall", "ep"), ("allreduce", "tp"),
                                       ("alltoall", "ep"), ("allreduce", "tp")], layer
    # At capacity: ceil(1.25 x 32 tokens x 2 / 4) = 20 rows per expert, 4
    # experts' rows of 64 bf16 sent: 20 x 4 x 64 x 2 bytes.
    assert "bytes: 10240.0" in text
    # The rank's 2 experts of the 4, each 3 x 64 x 128 split over tp 2.
    assert "layer_expert_parameters: 24576" in text, text[-600:]
    assert "(ep 2 of dp)" in proc.stdout and "top-2 of 4 experts" in proc.stdout
    a2a = re.search(r"expert-parallel all-to-all +([0-9.]+) ms", proc.stdout)
    assert a2a and float(a2a.group(1)) > 0, proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--ep", "3"], "--ep 3 does not divide the 4 experts of {model} (experts)"),
    (["--ep", "4", "--tp", "4", "--ranks-per-node", "8"], "--ep 4 does not divide the "
                                                           "data-parallel size 2"),
    (["--ep", "2", "--tp", "2", "--sequence-parallel"], "--sequence-parallel with experts"),
    (["--capacity-factor", "-1"], "--capacity-factor"),
])
def test_bad_expert_layouts_are_refused_naming_the_field(tmp_path, args, message):
    model = tmp_path / "tiny-moe.textproto"
    model.write_text(TINY_MOE)
    proc = predict("--model", str(model), "--seq", "32", "--global-batch", "16",
                   "--ranks-per-node", "16", *args, timeout=30)
    assert proc.returncode == 2, proc.stdout
    assert message.format(model=model) in proc.stderr, proc.stderr
    model.write_text(TINY_MOE.replace("top_k: 2", "top_k: 5"))
    proc = predict("--model", str(model), "--seq", "32", "--global-batch", "16", timeout=30)
    assert proc.returncode == 2
    assert f"{model}: top_k (5) must be between 1 and experts (4)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "tp 3 does not divide the model's 4 attention heads"),
    (["--pp", "3", "--tp", "2"], "pp 3 is more than the model's 2 layers"),
    (["--global-batch", "3"], "--global-batch 3 is not a multiple of micro-batch 1 x dp 16"),
    (["--tp", "0"], "--tp"),
    (["--seq", "0"], "--seq"),
    (["--zero", "4"], "--zero"),
    (["--activation-checkpointing", "some"], "--activation-checkpointing must be none, "
                                             "selective or full, got 'some'"),
    (["--nodes", "9000"], "--nodes"),
    (["--dp", "3"], "tp 1 x pp 1 x dp 3 = 3 ranks do not fill whole nodes of 16"),
    (["--dp", "4", "--nodes", "2"], "--dp 4 but the cluster's 32 ranks / (tp 1 x pp 1) make "
                                    "dp 32"),
    (["--ep", "2"], "--ep and --capacity-factor need a Mixture of Experts"),
])
def test_bad_layouts_are_refused_before_capturing(tiny, args, message):
    base = {"--seq": "32", "--global-batch": "16"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    proc = predict("--model", tiny, "--ranks-per-node", "16", *flat, timeout=30)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_bad_model_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "bad.textproto"
    path.write_text(TINY.replace('norm: "rmsnorm"', 'norm: "rmsnorm"\nshared_experts: 8'))
    proc = predict("--model", str(path), "--seq", "32", "--global-batch", "1", timeout=30)
    assert proc.returncode == 2
    assert f"{path}: line 11" in proc.stderr and '"shared_experts"' in proc.stderr, proc.stderr
    path.write_text(TINY.replace("kv_heads: 2", "kv_heads: 3"))
    proc = predict("--model", str(path), "--seq", "32", "--global-batch", "1", timeout=30)
    assert proc.returncode == 2
    assert "kv_heads (3) do not divide heads (4)" in proc.stderr, proc.stderr


def test_a_layout_that_does_not_fit_is_refused_with_its_numbers():
    # Llama 2 70B without model parallelism: its weights alone exceed a core.
    proc = predict("--model", os.path.join(SOURCE, "configs/models/llama2-70b.textproto"),
                   "--seq", "4096", "--global-batch", "32", "--zero", "1", *TRN1)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not fit the 16.00 GiB of HBM per NeuronCore" in proc.stderr
    weights = re.search(r"weights and optimizer state +([0-9.]+) GiB", proc.stdout)
    assert weights and float(weights.group(1)) > 16, proc.stdout
    assert "DOES NOT FIT" in proc.stdout


def test_published_rows_keep_their_recorded_errors(tmp_path):
    table = os.path.join(SOURCE, "configs/scaling/published-trn1.textproto")
    proc = predict("--table", table, "--check", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "report.md").read_text()
    assert "| Llama2-7B |" in report and "| fitted |" in report
    assert report.count("| held out |") == 5, report
    # A pipeline row's wait on messages, split: transfers and the bubble (1F1B
    # over 64 microbatches and 8 stages: about 7/71 of the step).
    cells = next(line for line in report.splitlines() if line.startswith("| Llama2-13B |"))
    step, pp_comm, bubble = (float(cells.split("|")[i].split()[0]) for i in (7, 11, 12))
    assert 0 < pp_comm < bubble and 0.05 < bubble / step < 0.2, cells
    # A row whose recorded error is 6 points off fails the check, named.
    text = open(table).read()
    first = text[:text.index("rows {", text.index("rows {") + 1)]
    moved = tmp_path / "moved.textproto"
    moved.write_text(first.replace("recorded_error_pct: 0.0", "recorded_error_pct: 6.0")
                     .replace('"../', f'"{SOURCE}/configs/'))
    proc = predict("--table", str(moved), "--check", timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Llama2-7B: error " in proc.stderr and "6.0% recorded" in proc.stderr, proc.stderr
