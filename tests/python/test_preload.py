"""neuronrun --preload: Python ranks forked from a zygote that imported the
modules once (launcher/src/zygote.h, python/neuronrun_zygote.py) behave as
fresh interpreters started by neuronrun: their own environment, argv,
__main__ and sys.path; neuronrun's children; exit codes, signals and
tracebacks as usual; nothing left running. A light module stands in for
torch, which the matrix and the suite preload."""
import os
import re
import subprocess
import sys
import uuid

import pytest

NEURONRUN = os.environ["NEURONRUN"]

# It sets a variable at import, as torch sets TORCHINDUCTOR_CACHE_DIR.
PROBE = ("import os\nIMPORTED_IN = os.getpid()\nRANK_AT_IMPORT = os.environ.get(\"RANK\")\n"
         "os.environ.setdefault(\"TORCH_PROBE_AT_IMPORT\", \"1\")\n")

SCRIPT = r"""
import gc, os, random, sys
import probe_mod
print("rank", os.environ["RANK"], "local", os.environ["LOCAL_RANK"],
      "preloaded", probe_mod.IMPORTED_IN != os.getpid(), "parent", os.getppid(),
      "main", __name__, "path0", sys.path[0], "argv", sys.argv[1:],
      "random", random.random(), "rank_at_import", probe_mod.RANK_AT_IMPORT,
      "frozen", gc.isenabled() and gc.get_freeze_count() > 0, flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "exit" and os.environ["RANK"] == "1":
    sys.exit(3)
if mode == "raise" and os.environ["RANK"] == "1":
    def inner():
        raise ValueError("bad value from rank 1")
    inner()
if mode == "kill" and os.environ["RANK"] == "1":
    import signal
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "kill-zygote" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    if os.environ["RANK"] != "0":
        sys.exit(0)  # rank 0 alone fails the attempt, once the zygote is dead
    import signal
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if b"neuronrun_zygote" in cmd and os.environ["PRELOAD_TEST_MARKER"].encode() in env:
            os.kill(int(pid), signal.SIGKILL)
    sys.exit(1)  # the attempt fails; the restart finds the zygote gone
if mode in ("raise", "kill") and os.environ["RANK"] == "0":
    import time
    time.sleep(120)  # ended by neuronrun when rank 1 fails
"""


def job(tmp_path, args, preload="probe_mod", env=None, flags=("-n", "2")):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "script.py").write_text(SCRIPT)
    marker = uuid.uuid4().hex
    full = dict(os.environ, PYTHONPATH=str(tmp_path), PRELOAD_TEST_MARKER=marker, **(env or {}))
    proc = subprocess.Popen([NEURONRUN, *flags, "--preload", preload,
                             str(tmp_path / "script.py")] + args,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full)
    out, err = proc.communicate(timeout=120)
    return proc, out, err, marker


def ranks(out):
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[rank (\d)\]: rank (\d) local (\d) preloaded (\w+) parent (\d+) main "
                     r"(\S+) path0 (\S+) argv (.*) random (\S+) rank_at_import (\S+) frozen (\w+)$", line)
        if m:
            found[int(m.group(1))] = m.groups()
    return found


def carriers(marker):
    """Live processes whose environment holds the job's marker."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"PRELOAD_TEST_MARKER={marker}".encode() in f.read(1 << 20):
                    pids.append(pid)
        except OSError:
            pass
    return pids


def test_forked_ranks_are_neuronruns_children_with_their_own_environment(tmp_path):
    proc, out, err, marker = job(tmp_path, ["a b", "c"])
    assert proc.returncode == 0, err
    seen = ranks(out)
    assert sorted(seen) == [0, 1], out
    for rank, (r, env_rank, local, preloaded, parent, main, path0, argv, rnd, at_import,
               frozen) in seen.items():
        assert int(env_rank) == int(local) == rank
        assert preloaded == "True", out  # imported once, in the zygote
        assert int(parent) == proc.pid, out  # re-parented to neuronrun
        assert main == "__main__" and path0 == str(tmp_path)
        assert argv == "['a b', 'c']"
        assert at_import == "None", out  # the zygote holds no rank's own variables
        # The collector runs, past the zygote's objects (gc.freeze before the fork).
        assert frozen == "True", out
    assert seen[0][8] != seen[1][8], "the ranks share the zygote's random state"
    assert carriers(marker) == []


def test_a_single_ranks_zygote_holds_no_rank_variables(tmp_path):
    proc, out, err, _ = job(tmp_path, [], flags=("-n", "1"))
    assert proc.returncode == 0, err
    assert ranks(out)[0][3] == "True" and ranks(out)[0][9] == "None", out


def test_a_zygote_that_dies_mid_job_leaves_fresh_interpreters_for_the_restart(tmp_path):
    proc, out, err, marker = job(tmp_path, ["kill-zygote"], flags=("-n", "2", "--max-restarts", "1"))
    assert proc.returncode == 0, err
    assert "the ranks start as fresh interpreters" in err, err
    preloaded = re.findall(r"preloaded (\w+)", out)
    assert preloaded[0] == "True" and preloaded[-2:] == ["False", "False"], out  # then fresh
    assert carriers(marker) == []


def test_a_failing_ranks_exit_code_and_traceback_are_its_own(tmp_path):
    proc, out, err, marker = job(tmp_path, ["exit"])
    assert proc.returncode == 3, err
    assert "rank 1 (node 0" in err and "exited with code 3" in err
    proc, out, err, marker = job(tmp_path, ["raise"])
    assert proc.returncode == 1, err
    # The traceback starts at the script, as a fresh interpreter's does.
    tb = [line for line in err.splitlines() if line.startswith("[rank 1]: ")]
    assert tb[0] == "[rank 1]: Traceback (most recent call last):", err
    assert f'File "{tmp_path / "script.py"}"' in tb[1], err
    assert "neuronrun_zygote" not in err and "runpy" not in err
    assert tb[-1] == "[rank 1]: ValueError: bad value from rank 1", err
    assert carriers(marker) == []  # rank 0, asleep, was ended too


def test_a_rank_killed_by_a_signal_ends_the_job_and_leaves_nothing(tmp_path):
    proc, out, err, marker = job(tmp_path, ["kill"])
    assert proc.returncode == 128 + 9, err
    assert "rank 1" in err and "SIGKILL" in err, err
    assert carriers(marker) == []


def test_a_module_that_cannot_be_preloaded_leaves_fresh_interpreters(tmp_path):
    proc, out, err, _ = job(tmp_path, [], preload="probe_mod,no_such_module_here")
    assert proc.returncode == 0, err
    assert ("importing no_such_module_here failed: ModuleNotFoundError" in err
            and "the ranks start as fresh interpreters" in err), err
    assert {r[3] for r in ranks(out).values()} == {"False"}, out  # each imported it itself
    assert {r[10] for r in ranks(out).values()} == {"False"}, out  # nothing frozen
    (tmp_path / "threads_mod.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    proc, out, err, _ = job(tmp_path, [], preload="threads_mod")
    assert proc.returncode == 0, err
    assert "importing threads_mod started 1 thread(s)" in err, err


def test_a_bad_module_name_is_a_usage_error(tmp_path):
    proc = subprocess.run([NEURONRUN, "--preload", "torch,,x", sys.executable],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--preload 'torch,,x': '' is not a Python module name" in proc.stderr, proc.stderr


# A trainer for `neuronrun matrix` (its cells' ranks fork from the matrix's
# one zygote, NEURON_ZYGOTE_FD): the model's dim picks what rank 1 does.
MATRIX_TRAINER = r"""
import os, signal, sys, time
import probe_mod
args = sys.argv[1:]
dim, rank = int(args[args.index("--dim") + 1]), os.environ["RANK"]
print("rank", rank, "preloaded", probe_mod.IMPORTED_IN != os.getpid(), "zygote",
      probe_mod.IMPORTED_IN, "fd", os.environ.get("NEURON_ZYGOTE_FD"), "cwd", os.getcwd(),
      flush=True)
if dim == 24 and rank == "1":
    sys.exit(3)
if dim == 40 and rank == "1":
    os.kill(os.getpid(), signal.SIGKILL)
if dim == 48 and rank == "1":  # its neuronrun dies: the keepers end the ranks
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        if (cmd[0].endswith(b"neuronrun") and b"matrix" not in cmd
                and os.environ["PRELOAD_TEST_MARKER"].encode() in env):
            os.kill(int(pid), signal.SIGKILL)
if dim in (40, 48):
    time.sleep(120)  # ended with its job
if rank == "0":
    out = args[args.index("--metrics-out") + 1]
    open(out, "w").write("loss: 1.5\nmodelled_step_us: 10\n")
"""


def test_a_matrix_forks_every_cells_ranks_from_one_zygote_and_relays_their_ends(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "trainer.py").write_text(MATRIX_TRAINER)
    models = "".join(f'models {{ name: "{n}" dim: {d} layers: 1 heads: 2 seq: 8 vocab: 32 }}\n'
                     for n, d in (("ok", 16), ("exit", 24), ("kill", 40), ("orphan", 48)))
    (tmp_path / "m.textproto").write_text(
        f'name: "z" script: "{tmp_path / "trainer.py"}" steps: 2 batch: 2 ranks_per_node: [2]\n'
        'strategies { name: "dp" }\n' + models)
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PRELOAD_TEST_MARKER=marker,
               NEURON_PRELOAD="probe_mod")
    env.pop("NEURON_ZYGOTE", None)  # `make test`'s: the matrix would leave its cells to it
    proc = subprocess.run([NEURONRUN, "matrix", str(tmp_path / "m.textproto"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env,
                          timeout=90)
    assert "4 cells: 1 completed or modelled (0 from an earlier run), 3 failed" in proc.stdout, \
        proc.stdout + proc.stderr
    logs = {n: (tmp_path / "out" / "cells" / f"n1x2-dp-{n}-eager-default" / "output.log")
            .read_text() for n in ("ok", "exit", "kill", "orphan")}
    def starts_of(log):
        return re.findall(r"\[rank \d\]: rank \d preloaded (\w+) zygote (\d+) fd (\S+)", log)
    # A failing cell may end its other rank before that one printed.
    assert len(starts_of(logs["ok"])) == 2 and all(starts_of(v) for v in logs.values()), logs
    starts = starts_of("".join(logs.values()))
    assert {s[0] for s in starts} == {"True"}, logs  # forked, not fresh
    assert len({s[1] for s in starts}) == 1, logs  # from one zygote, for every cell
    assert {s[2] for s in starts} == {"None"}, logs  # the connection is neuronrun's alone
    assert "rank 1 (node 0" in logs["exit"] and "exited with code 3" in logs["exit"], logs
    assert "rank 1" in logs["kill"] and "SIGKILL" in logs["kill"], logs
    assert carriers(marker) == []  # no rank, keeper or zygote left, the orphans' included


def test_a_bad_zygote_connection_is_named(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "script.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), NEURON_ZYGOTE_FD="abc")
    command = [NEURONRUN, "-n", "1", "--preload", "probe_mod", str(tmp_path / "script.py")]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "NEURON_ZYGOTE_FD='abc' is not an integer" in proc.stderr, proc.stderr
    env["NEURON_ZYGOTE_FD"] = "0"  # /dev/null, not a connection
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert ("descriptor 0 is not a connection to a shared zygote" in proc.stderr
            and "the ranks fork from a zygote of this job's own" in proc.stderr), proc.stderr
    assert ranks(proc.stdout)[0][3] == "True", proc.stdout


def test_neuronrun_zygote_serves_its_commands_jobs_that_share_its_settings(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "trainer.py").write_text(MATRIX_TRAINER)
    job = (f"{NEURONRUN} -n 2 --preload probe_mod {tmp_path / 'trainer.py'} --dim 16 "
           "--metrics-out /dev/null")
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(tmp_path), PRELOAD_TEST_MARKER=marker)
    env.pop("NEURON_RT_VISIBLE_CORES", None)
    # Two jobs as the zygote's environment has it, one with the value its
    # imports set, one with other devices (a setting torchneuron reads at
    # import): that one starts its own.
    (tmp_path / "elsewhere").mkdir()
    command = (f'echo "socket $NEURON_ZYGOTE"; {job} && (cd {tmp_path / "elsewhere"} && {job}) && '
               f"TORCH_PROBE_AT_IMPORT=1 {job} && NEURON_RT_VISIBLE_CORES=0-1 {job} && exit 3")
    proc = subprocess.run([NEURONRUN, "zygote", "--preload", "probe_mod", "--", "sh", "-c",
                           command], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr  # the command's status
    starts = re.findall(r"\[rank \d\]: rank \d preloaded (\w+) zygote (\d+)", proc.stdout)
    assert len(starts) == 8 and {s[0] for s in starts} == {"True"}, proc.stdout
    shared = {s[1] for s in starts[:6]}
    assert len(shared) == 1, proc.stdout  # one zygote for the three jobs
    cwds = re.findall(r"\[rank \d\]: rank \d preloaded \w+ zygote \d+ fd \S+ cwd (\S+)", proc.stdout)
    assert cwds[2:4] == [str(tmp_path / "elsewhere")] * 2, proc.stdout  # its neuronrun's
    assert {s[1] for s in starts[6:]} != shared and len({s[1] for s in starts[6:]}) == 1
    socket_path = re.search(r"^socket (\S+)$", proc.stdout, re.M).group(1)
    assert not os.path.exists(os.path.dirname(socket_path))  # removed with the zygote
    assert carriers(marker) == []
    bad = subprocess.run([NEURONRUN, "zygote", "--preload", "probe_mod", "true"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown argument 'true'" in bad.stderr, bad.stderr


def test_neuronrun_zygote_leaves_a_job_in_another_network_namespace_to_its_own(tmp_path):
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --net is not permitted here")
    (tmp_path / "probe_mod.py").write_text(PROBE)
    (tmp_path / "trainer.py").write_text(MATRIX_TRAINER)
    job = (f"{NEURONRUN} -n 1 --preload probe_mod {tmp_path / 'trainer.py'} --dim 16 "
           "--metrics-out /dev/null")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("NEURON_RT_VISIBLE_CORES", None)
    # Its ranks would reach nothing of the job's network from the zygote's.
    proc = subprocess.run([NEURONRUN, "zygote", "--preload", "probe_mod", "--", "sh", "-c",
                           f"{job} && unshare --net sh -c 'ip link set lo up; {job}'"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    zygotes = re.findall(r"\[rank 0\]: rank 0 preloaded True zygote (\d+)", proc.stdout)
    assert len(zygotes) == 2 and zygotes[0] != zygotes[1], proc.stdout


EXEC_PROBE = ("import os, sys, probe_mod; print('exec', probe_mod.IMPORTED_IN != os.getpid(), "
              "sys.argv, os.getcwd(), os.environ['OMP_NUM_THREADS']); "
              "print('to stderr', file=sys.stderr); sys.exit(5)")


def test_neuronrun_zygote_exec_forks_python_from_the_zygote_or_runs_it(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    env.pop("NEURON_RT_VISIBLE_CORES", None)
    env.pop("NEURON_PRELOAD", None)
    (tmp_path / "elsewhere").mkdir()
    run = f"{NEURONRUN} zygote exec -c \"{EXEC_PROBE}\" a 'b c'; echo status $?"
    command = (f"cd {tmp_path / 'elsewhere'} && {run} && NEURON_PRELOAD= {run} && "
               f"NEURON_PRELOAD=probe_mod {run} && NEURON_PRELOAD=json,probe_mod {run}")
    proc = subprocess.run([NEURONRUN, "zygote", "--preload", "probe_mod", "--", "sh", "-c",
                           command], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = re.findall(r"^exec (\w+) (\[.*\]) (\S+) (\d+)\nstatus (\d+)$", proc.stdout, re.M)
    # Forked; NEURON_PRELOAD set empty: fresh; its modules imported: forked;
    # one not imported (json): fresh.
    assert [r[0] for r in runs] == ["True", "False", "True", "False"], proc.stdout
    for preloaded, argv, cwd, threads, status in runs:
        assert argv == "['-c', 'a', 'b c']" and cwd == str(tmp_path / "elsewhere"), proc.stdout
        assert threads == "1" and status == "5", proc.stdout  # a rank's environment, its status
    assert proc.stderr.count("to stderr") == 4, proc.stderr
