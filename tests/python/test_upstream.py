"""PyTorch's own distributed stack (DeviceMesh, DTensor, FSDP2, tensor and
sequence parallel, pipelining, DCP) run unchanged on "neuron" under
neuronrun, against one process and, for a case of each kind of collective,
against the same script on Gloo/CPU. Four jobs, the last example 08."""
import os
import re
import subprocess

import pytest

NEURONRUN = os.environ["NEURONRUN"]
SCRIPT = os.path.join(os.environ["NEURON_SOURCE_DIR"], "tests/python/scripts/upstream_parity.py")
CASES = ["fsdp2", "fsdp2-bf16-offload", "tp", "tp-sp", "fsdp2xtp", "pp-gpipe", "pp-1f1b",
         "pp-interleaved1f1b",
         "zero1", "zero3-offload", "mesh"]  # torchneuron.parallel's ZeRO and get_device_mesh()


def run(n, *args):
    proc = subprocess.run([NEURONRUN, "-n", str(n), SCRIPT, *args], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def losses(stdout, where):
    """Each case's losses, from rank 0's lines."""
    found = {}
    for case, values in re.findall(rf"\[rank 0\]: upstream parity (\S+) on {where}: 10 steps, "
                                   r"losses ((?:\d+\.\d+ ?){10})", stdout):
        found[case] = [float(v) for v in values.split()]
    return found


@pytest.fixture(scope="module")
def on_neuron():
    return run(4)


def test_every_upstream_api_matches_one_process_on_neuron(on_neuron):
    # The script asserts each case's losses against the one-process
    # reference (fp32: 1e-5; bf16 mixed precision with CPU offload: 2e-2).
    found = losses(on_neuron, "neuron/neuron")
    assert sorted(found) == sorted(CASES), on_neuron
    assert "[rank 0]: upstream parity dcp on neuron/neuron: FSDP2 x4 -> FSDP2 x TP, 156 tensors " \
           "equal" in on_neuron, on_neuron
    assert "[rank 0]: upstream parity: 13 cases ok on 4 ranks, neuron/neuron" in on_neuron
    assert found["fsdp2"][-1] < found["fsdp2"][0] / 4  # it trains


def test_torchneuron_zero_and_mesh_meet_fsdp2(on_neuron):
    # ZeRO 1 and 3 of torchneuron.parallel train the same model to FSDP2's
    # losses, and FSDP2 x TP on initialize(tp=2)'s DeviceMesh to those of
    # FSDP2 x TP on init_device_mesh's.
    found = losses(on_neuron, "neuron/neuron")
    for zero in ("zero1", "zero3-offload"):
        for a, b in zip(found[zero], found["fsdp2"]):
            assert abs(a - b) <= 2e-6, (zero, found[zero], found["fsdp2"])
    for a, b in zip(found["mesh"], found["fsdp2xtp"]):
        assert abs(a - b) <= 2e-6, (found["mesh"], found["fsdp2xtp"])
    # A ZeRO-3 checkpoint loads into ZeRO-3 and into FSDP2 x TP, and that
    # model's DCP checkpoint into ZeRO-3: the 52 tensors of the model's state
    # bitwise each time (the script compares them).
    assert "[rank 0]: upstream parity checkpoint-interop on neuron/neuron: ZeRO-3 -> ZeRO-3, -> " \
           "FSDP2 x TP -> DCP -> ZeRO-3, 156 tensors equal" in on_neuron, on_neuron


# On Gloo, a case of each kind of collective: FSDP2's all-gathers and
# reduce-scatters (in bf16 too), sequence parallel's, FSDP2 x TP's on a 2-D
# mesh, a pipeline's sends and receives, torchneuron's ZeRO-3. Each of them,
# and the rest, also meets the one-process reference on neuron.
GLOO_CASES = ["fsdp2-bf16-offload", "tp-sp", "fsdp2xtp", "pp-interleaved1f1b", "zero3-offload"]


def test_the_same_script_on_gloo_agrees(on_neuron):
    on_cpu = run(4, "--cpu", "--cases", ",".join(GLOO_CASES))
    neuron, gloo = losses(on_neuron, "neuron/neuron"), losses(on_cpu, "cpu/gloo")
    assert sorted(gloo) == sorted(GLOO_CASES), on_cpu
    assert "[rank 0]: upstream parity: 5 cases ok on 4 ranks, cpu/gloo" in on_cpu, on_cpu
    for case in GLOO_CASES:
        for a, b in zip(neuron[case], gloo[case]):
            assert abs(a - b) <= 2e-6, (case, neuron[case], gloo[case])


def test_three_d_pipeline_fsdp2_and_tensor_parallel_on_neuron():
    out = run(8, "--cases", "3d")
    assert "[rank 0]: upstream parity: 1 cases ok on 8 ranks, neuron/neuron" in out, out
    assert list(losses(out, "neuron/neuron")) == ["3d"], out


def test_example_08_trains_pp_tp_fsdp2_and_saves_a_dcp_checkpoint(tmp_path):
    example = os.path.join(os.environ["NEURON_SOURCE_DIR"], "examples/08_upstream_gpt.py")
    checkpoint = tmp_path / "ckpt"
    proc = subprocess.run([NEURONRUN, "-n", "4", example, "--pp", "2", "--tp", "2", "--sp",
                           "--schedule", "interleaved", "--steps", "3", "--data", "counting",
                           "--checkpoint", str(checkpoint)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "returned a view tensor" not in proc.stderr, proc.stderr  # FSDP2's warning
    out = proc.stdout
    assert ("[rank 0]: upstream GPT: 4 ranks = pp 2 x dp 1 x tp 2 (sequence parallel) on "
            "neuron, backend neuron, schedule interleaved") in out, out
    steps = re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+), wall [\d.]+ ms \(\d+ tokens/s\), "
                       r"modelled Trainium2 step ([\d.]+) us", out)
    assert len(steps) == 3, out
    for loss, modelled in steps:
        assert 2.0 < float(loss) < 7.0 and float(modelled) > 0  # ln(256) = 5.5 at the start
    # The counting task is learnt: the loss falls from the first step.
    assert float(steps[-1][0]) < float(steps[0][0]) - 0.2, steps
    assert re.search(r"\[rank 0\]: training: loss [\d.]+ -> [\d.]+ over 3 steps \(falls\)",
                     out), out
    assert f"saved a DCP checkpoint of the model and optimizer to {checkpoint}" in out
    assert sorted(p.name for p in checkpoint.iterdir() if p.suffix == ".distcp") == \
        [f"__{r}_0.distcp" for r in range(4)]
    peaks = re.search(r"peak device memory per rank \(MiB\): ((?:[\d.]+ ?){4})$", out, re.M)
    assert peaks and all(float(v) > 0 for v in peaks.group(1).split()), out
