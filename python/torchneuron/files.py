"""Files the package writes (traces, run figures, predictions, plots), safely.

    from torchneuron.files import write_atomically
    write_atomically("out/results.txt", text)   # str or bytes

The Python counterpart of the runtime's WriteFileAtomically
(runtime/files.h): the bytes go to a temporary with a random name in the
target's directory (tempfile.mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW, mode
0600), are flushed to disk and renamed over the target (os.replace), so a
reader sees the old file or the whole new one, and nothing planted under a
guessed name is followed or overwritten. A symbolic link at the target
itself is refused (an OSError naming it): whoever planted it meant the
write for the file it points to.
"""
import errno
import os
import stat
import tempfile


def write_atomically(path, data, mode=0o644):
    """Writes `data` (str, as UTF-8, or bytes) to `path`, created with `mode`
    (less the umask). Raises OSError naming `path` (a symbolic link there,
    a directory that is not there or not writable)."""
    path = os.fspath(path)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise OSError(errno.ELOOP, f"cannot write {path}: it is a symbolic link, "
                                       f"not followed", path)
    except FileNotFoundError:
        pass
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory, name = os.path.split(os.path.abspath(path))
    fd, temp = tempfile.mkstemp(prefix=f"{name}.tmp.{os.getpid()}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _umask():
    """The process's umask, read without changing it (os.umask would, for a
    moment, in every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
