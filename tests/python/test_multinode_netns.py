"""A real two-node job on one machine: two network namespaces joined by a
veth pair, one neuronrun agent in each, the GPT example across both (the
nodes' collectives over TCP through the veth, hierarchical). Then a node's
agent is killed mid-run: the other node's job ends with a summary naming
it. Skipped, with the reason, where the machine forbids namespaces (needs
root and iproute2)."""
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

NEURONRUN = os.environ["NEURONRUN"]
EXAMPLE = os.path.join(os.environ["NEURON_SOURCE_DIR"], "examples/04_train_gpt.py")


def _sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture
def two_nodes():
    """Two namespaces with 10.77.X.1 and 10.77.X.2 on a veth pair."""
    tag = uuid.uuid4().hex[:6]
    ns = [f"tn{i}-{tag}" for i in range(2)]
    veth = [f"vt{i}-{tag}" for i in range(2)]
    subnet = 100 + int(tag[:2], 16) % 100
    probe = _sh("ip", "netns", "add", ns[0])
    if probe.returncode != 0:
        pytest.skip(f"network namespaces are not available here: {probe.stderr.strip()}")
    try:
        steps = [("ip", "netns", "add", ns[1]),
                 ("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])]
        for i in range(2):
            steps += [("ip", "link", "set", veth[i], "netns", ns[i]),
                      ("ip", "-n", ns[i], "addr", "add", f"10.77.{subnet}.{i + 1}/24", "dev",
                       veth[i]),
                      ("ip", "-n", ns[i], "link", "set", veth[i], "up"),
                      ("ip", "-n", ns[i], "link", "set", "lo", "up")]
        for step in steps:
            r = _sh(*step)
            if r.returncode != 0:
                pytest.skip(f"cannot set up the namespaces ({' '.join(step)}): {r.stderr.strip()}")
        yield ns, [f"10.77.{subnet}.{i + 1}" for i in range(2)]
    finally:
        for n in ns:
            _sh("ip", "netns", "del", n)


def _agents(ns, addresses, steps, port=29611):
    env = dict(os.environ, NEURON_RDZV_SECRET=uuid.uuid4().hex)
    procs = []
    for node in range(2):
        cmd = ["ip", "netns", "exec", ns[node], NEURONRUN, "--nnodes", "2", "--node-rank",
               str(node), "--rdzv-endpoint", f"{addresses[0]}:{port}", "-n", "2", EXAMPLE,
               "--steps", str(steps), "--batch", "2", "--seq", "16", "--dim", "32",
               "--layers", "2", "--vocab", "64"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, start_new_session=True))
    return procs


def _wait_for_training(proc, timeout=120):
    """Reads node 0's output until its second step is printed."""
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline and "step 1:" not in seen:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    assert "step 1:" in seen, seen


def test_a_job_across_two_network_namespaces_trains(two_nodes):
    ns, addresses = two_nodes
    procs = _agents(ns, addresses, steps=3)
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    losses = re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+)", outs[0][0])
    assert len(losses) == 3, outs[0]
    assert "tp=1 x dp=4 x pp=1 (4 ranks)" in outs[0][0], outs[0][0]


STRANGER = """
import sys, datetime, torch.distributed as dist
host = sys.argv[1]
for port in map(int, sys.argv[2:]):
    try:
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=3))
        store.set("stranger", "1")
        print(f"{port} accepted: {store.get('stranger')!r}", flush=True)
    except Exception as e:
        print(f"{port} refused: {type(e).__name__}", flush=True)
"""


def _listeners(ns):
    """Ports listening on a non-loopback address (or every address) in `ns`."""
    out = _sh("ip", "netns", "exec", ns, "ss", "-Hltn").stdout
    ports = set()
    for line in out.splitlines():
        local = line.split()[3]
        host, port = local.rsplit(":", 1)
        if not host.startswith("127.") and host not in ("[::1]",):
            ports.add(int(port))
    return sorted(ports)


def test_no_listener_lets_a_stranger_in_and_a_cut_link_ends_the_job_on_both_nodes(two_nodes):
    """While a two-node job trains, a process on node 1 that is not part of
    it (another address than loopback) tries every port the job listens on
    in node 0's namespace with torch's own store client: the rendezvous, the
    env:// store (the job's authenticated one, not a TCPStore on
    MASTER_PORT) and the TCP transport all refuse it. Then the link between
    the nodes is cut: both agents end the job, each naming what it lost."""
    ns, addresses = two_nodes
    procs = _agents(ns, addresses, steps=100000, port=29615)
    try:
        _wait_for_training(procs[0])
        ports = _listeners(ns[0])
        assert 29615 in ports, ports  # the rendezvous, at least
        probe = subprocess.run(["ip", "netns", "exec", ns[1], sys.executable, "-c", STRANGER,
                                addresses[0], *map(str, ports)],
                               capture_output=True, text=True, timeout=120)
        answers = probe.stdout.splitlines()
        assert len(answers) == len(ports), probe.stdout + probe.stderr
        assert all(" refused: " in a for a in answers), answers
        veth = _sh("ip", "-n", ns[1], "-o", "link", "show", "type", "veth").stdout.split(":")[1]
        _sh("ip", "-n", ns[1], "link", "set", veth.strip().split("@")[0], "down")  # the cable
        start = time.monotonic()
        results = [p.communicate(timeout=120) for p in procs]
        took = time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate(timeout=30)
    assert all(p.returncode != 0 for p in procs), results
    assert took < 60, took
    # Node 0 names the node it lost; node 1 says it lost node 0's store.
    assert re.search(r"node 1", results[0][1]), results[0][1][-2000:]
    assert re.search(r"store|node 0", results[1][1]), results[1][1][-2000:]


def test_a_killed_node_ends_the_job_on_the_other_naming_it(two_nodes):
    ns, addresses = two_nodes
    procs = _agents(ns, addresses, steps=100000, port=29613)
    _wait_for_training(procs[0])
    os.killpg(procs[1].pid, signal.SIGKILL)  # node 1's agent and its ranks
    start = time.monotonic()
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=30)
    assert procs[0].returncode != 0
    assert time.monotonic() - start < 90
    assert re.search(r"node 1", err), err[-2000:]


def test_mpirun_starts_the_same_job_on_two_simulated_hosts(two_nodes):
    """The GPT example under Open MPI's mpirun across the two namespaces: the
    ranks read OMPI_* variables (torchneuron.init), mpirun reaches the
    second "host" through an rsh agent that enters its namespace, and each
    namespace has a host name of its own, so the ranks talk TCP across."""
    import shutil
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun (Debian's openmpi-bin) is not installed")
    if _sh("unshare", "--uts", "true").returncode != 0:
        pytest.skip("unshare --uts is not permitted here")
    ns, addresses = two_nodes
    agent = os.path.join(os.environ["NEURON_SOURCE_DIR"], "tests/python/scripts/netns_rsh.sh")
    subnet = addresses[0].rsplit(".", 1)[0] + ".0/24"
    env = dict(os.environ, NETNS_HOSTS=" ".join(f"{a}={n}" for a, n in zip(addresses, ns)),
               MASTER_ADDR=addresses[0], MASTER_PORT="29617",
               PYTHONPATH=os.path.join(os.path.dirname(NEURONRUN), "..", "python"),
               OMPI_MCA_plm_rsh_agent=agent, OMPI_MCA_oob_tcp_if_include=subnet,
               OMPI_MCA_btl_tcp_if_include=subnet, OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    job = [mpirun, "-n", "4", "--host", f"{addresses[0]}:2,{addresses[1]}:2",
           "-x", "PYTHONPATH", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "NETNS_HOSTS",
           sys.executable, EXAMPLE, "--steps", "3", "--batch", "2", "--seq", "16",
           "--dim", "32", "--layers", "2", "--vocab", "64"]
    cmd = ["ip", "netns", "exec", ns[0], "unshare", "--uts", "sh", "-c",
           f"hostname {ns[0]} && exec " + " ".join(job)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = re.findall(r"step \d: loss (\d+\.\d+)", proc.stdout)
    assert len(losses) == 3, proc.stdout
    assert "tp=1 x dp=4 x pp=1 (4 ranks)" in proc.stdout, proc.stdout
