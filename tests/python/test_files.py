"""The package's file writers never follow a planted symbolic link
(torchneuron.files.write_atomically: a random temporary made O_EXCL |
O_NOFOLLOW, then renamed)."""
import os
import stat
import sys

import pytest

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
from torchneuron import fabric, run_figures  # noqa: E402
from torchneuron.files import write_atomically  # noqa: E402


def test_writes_whole_files_with_their_mode_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "report.txt"
    write_atomically(path, "first\n")
    write_atomically(str(path), b"second\n")
    assert path.read_bytes() == b"second\n"
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
    write_atomically(path, "private", mode=0o600)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]
    with pytest.raises(FileNotFoundError):
        write_atomically(tmp_path / "missing" / "x.txt", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.txt"]


@pytest.mark.parametrize("writer", ["write_atomically", "run_figures", "export_chrome_trace"])
def test_a_link_planted_at_the_target_is_refused_and_not_followed(tmp_path, writer):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    link = tmp_path / "out.txt"
    link.symlink_to(victim)
    with pytest.raises(OSError, match=f"cannot write {link}: it is a symbolic link, "
                                      f"not followed"):
        if writer == "write_atomically":
            write_atomically(link, "overwritten")
        elif writer == "run_figures":
            run_figures.write(str(link), {"loss": 1.0}, {})
        else:
            fabric.export_chrome_trace(str(link))
    assert victim.read_text() == "precious"
    assert link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim"]
