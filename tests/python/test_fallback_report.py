"""torch.neuron.fallback_report (python/torchneuron/fallback_report.py): a
region's CPU fallbacks by operator and the user's source line, their share
of the region's modelled compute, nothing recorded outside a region, and
the report at the end of a neuronrun --fallback-report job (which sets
NEURON_FALLBACK_REPORT=1 for its ranks)."""
import inspect
import os
import subprocess
import sys
import textwrap
import threading

import pytest

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
os.environ.pop("LOCAL_RANK", None)
os.environ.pop("NEURON_FALLBACK_REPORT", None)

import torch  # noqa: E402

import torchneuron  # noqa: E402,F401  (registers the device)
from torchneuron import _C, fabric  # noqa: E402


def _line():
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def test_rows_count_each_fallback_at_the_callers_line():
    x = torch.randn(32, 32, device="neuron")
    with torch.neuron.fallback_report() as report:
        y = x @ x  # native: not a row
        for _ in range(3):
            torch.sort(y, dim=1); sort_line = _line()  # noqa: E702
        torch.unique(y); unique_line = _line()  # noqa: E702  (through torch/functional.py)
    rows = {(r.op, r.file, r.line): r.count for r in report.rows}
    assert rows == {("aten::sort.stable", __file__, sort_line): 3,
                    ("aten::_unique2", __file__, unique_line): 1}
    assert "aten::sort.stable" in str(report) and f"{__file__}:{sort_line}" in str(report)


def test_costs_and_shares_are_the_models_charges_in_the_region():
    x = torch.randn(64, 64, device="neuron")
    fabric.reset_eager()
    before = fabric.clock()["charged_us"]
    with torch.neuron.fallback_report() as report:
        y = x @ x
        torch.sort(y, dim=0)
        torch.cumsum(y, dim=1)
    step = fabric.clock()["charged_us"] - before
    fallbacks = {}
    for r in fabric.eager_records():
        if r["kind"] == "fallback":
            fallbacks[r["op"]] = fallbacks.get(r["op"], 0.0) + r["modelled_us"]
    assert report.step_us == pytest.approx(step)
    assert {r.op: r.modelled_us for r in report.rows} == pytest.approx(fallbacks)
    for r in report.rows:
        assert r.share == pytest.approx(r.modelled_us / step)
    assert 0 < report.fallback_us < report.step_us  # the matmul is the rest


def test_nothing_is_recorded_outside_a_region():
    x = torch.randn(16, device="neuron")
    before = _C._fallback_report_rows()
    torch.sort(x)
    assert _C._fallback_report_rows() == before
    with torch.neuron.fallback_report() as outer:
        torch.sort(x)
        with torch.neuron.fallback_report() as inner:
            torch.sort(x)
    torch.sort(x)
    assert [r.count for r in outer.rows] == [1, 1] and [r.count for r in inner.rows] == [1]
    assert sum(r[3] for r in _C._fallback_report_rows()) - sum(r[3] for r in before) == 2


def test_neuronrun_fallback_report_prints_each_ranks_report_at_exit(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import torch
        import torchneuron
        x = torch.randn(8, 8, device="neuron")
        for _ in range(2):
            torch.sort(x, dim=1)
        """))
    env = {k: v for k, v in os.environ.items() if k != "NEURON_FALLBACK_REPORT"}
    done = subprocess.run([NEURONRUN, "-n", "2", "--fallback-report", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}]: neuron fallback report: 1 CPU fallback site(s)" in done.stderr
        row = [line for line in done.stderr.splitlines()
               if line.startswith(f"[rank {rank}]: aten::sort.stable")]
        assert len(row) == 1 and row[0].split()[3] == "2", done.stderr
        assert row[0].endswith(f"{script}:5"), done.stderr


def test_stopping_without_a_recording_report_is_an_error():
    with pytest.raises(torchneuron.InvalidUsageError, match="without a recording report"):
        _C._fallback_report_stop()


def test_a_python_threads_fallback_names_its_own_line():
    x = torch.randn(16, device="neuron")
    lines = []

    def work():
        torch.sort(x); lines.append(_line())  # noqa: E702

    with torch.neuron.fallback_report() as report:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert [(r.op, r.file, r.line) for r in report.rows] == [("aten::sort.stable", __file__,
                                                              lines[0])]
