"""Trainium3 chosen by its files, end to end: a 2-rank neuronrun job on the
trn3 node with NeuronCore-v4 sees the Trainium3 device and prices its
all-reduce on the trn3 fabric, as neuron-cc-perf's model does for the same
files (and not as it does for trn2's).

One job of 2 Python ranks (~1.5 s of CPU each importing torch).
"""
import os
import re
import subprocess
import textwrap

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]
CC_PERF = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "collectives",
                       "neuron-cc-perf")
TRN3 = os.path.join(SOURCE, "configs/topologies/trn3-node.textproto")
V4 = os.path.join(SOURCE, "configs/devices/neuroncore-v4.textproto")
BYTES = 64 << 20  # an all-reduce of 16 Mi float32 per rank

SCRIPT = """
import torch, torch.distributed as dist, torchneuron
from torchneuron import fabric
dist.init_process_group("neuron")
x = torch.ones({elements}, device="neuron")
dist.all_reduce(x)
assert x[0].item() == 2.0
r = fabric.records()[-1]
print("device", torch.neuron.device_count(), torch.neuron.get_device_name(),
      torch.neuron.get_device_properties().total_memory)
print("allreduce", r["bytes"], r["fabric_algorithm"], repr(r["modelled_us"]))
dist.destroy_process_group()
"""


def model_only_us(topology, device):
    """neuron-cc-perf's modelled time of the 2-rank all-reduce, in us."""
    done = subprocess.run([CC_PERF, "--model-only", "-N", "2", "-b", str(BYTES), "-e",
                           str(BYTES), "--topology", topology, "--device", device],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = re.search(rf"^ +{BYTES} +\d+ +([0-9.]+) ", done.stdout, re.MULTILINE)
    assert row, done.stdout
    return float(row.group(1))


def test_a_job_on_trn3_sees_neuroncore_v4_and_the_trn3_fabric(tmp_path):
    script = tmp_path / "trn3_job.py"
    script.write_text(textwrap.dedent(SCRIPT.format(elements=BYTES // 4)))
    done = subprocess.run([NEURONRUN, "-n", "2", "--topology", TRN3, "--device", V4,
                           str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    devices = re.findall(r"^\[rank \d\]: device (.*)$", done.stdout, re.MULTILINE)
    # 16 chips x 8 NeuronCore-v4 at LNC=2; each logical core 2 x 18 GiB.
    assert devices == ["64 neuroncore-v4 (LNC=2) 38654705664"] * 2, done.stdout
    reduces = re.findall(r"^\[rank \d\]: allreduce ([0-9.]+) (\w+) ([0-9.e+-]+)$", done.stdout,
                         re.MULTILINE)
    assert len(reduces) == 2 and reduces[0] == reduces[1], done.stdout
    assert float(reduces[0][0]) == BYTES
    modelled = float(reduces[0][2])
    trn3 = model_only_us(TRN3, V4)
    assert abs(modelled - trn3) <= 0.01, (modelled, trn3)
    trn2 = model_only_us(os.path.join(SOURCE, "configs/topologies/trn2-node.textproto"),
                         os.path.join(SOURCE, "configs/devices/neuroncore-v3.textproto"))
    assert abs(trn2 - trn3) > 0.05 * trn2, (trn2, trn3)
