"""neuronrun's zygote (`neuronrun --preload MODULES`): one Python interpreter
imports MODULES once, then forks every rank from that state, so each rank
starts with them imported instead of spending seconds of CPU on `import
torch`.

Started by neuronrun as `python -m neuronrun_zygote FD MODULE[,MODULE...]`,
with the job's and the node's environment (a rank's, less RANK,
LOCAL_RANK, ROLE_RANK, chip and core), FD one end of a
SOCK_SEQPACKET socket pair. The protocol, one datagram each:

  zygote -> neuronrun   b"ready" once MODULES are imported, or
                        b"error MESSAGE" (an import failed; the zygote exits)
  neuronrun -> zygote   a rank: NUL-separated fields
                          NEURONRUN_PID, CPU (-1: unpinned), its working
                          directory, ARGC, ARGV..., ENV... ("NAME=value")
                        with two descriptors attached (SCM_RIGHTS): the
                        rank's stdout and stderr
  zygote -> neuronrun   b"pid N", or b"error MESSAGE"

ARGV is what a fresh interpreter would get after the interpreter's own
name: SCRIPT ARGS..., -m MODULE ARGS... or -c CODE ARGS... . Each rank is forked twice (a
short-lived middle process forks it and exits), so it is re-parented to
neuronrun, a child subreaper: neuronrun waits for it, signals its process
group and reads its pipes as for a rank it started itself. End of file on
the socket ends the zygote.

Shared (one zygote for several jobs: `neuronrun matrix`'s cells, or the
jobs of `neuronrun zygote -- COMMAND`, which adds `--listen PATH`):

  owner -> zygote       b"connect" with one descriptor attached: a new
                        client's end of a socket pair (the client, a
                        cell's neuronrun, got the other end); or a client
                        connects to PATH (a process of this user only)
  zygote -> client      b"zygote", MODULES, its namespaces (network,
                        mounts, ...: "net:[N],..."), the environment it
                        started with (NAME=value), b"", what the imports
                        set in it (NUL-separated), once
  client -> zygote      rank requests as above, each with a third
                        descriptor attached, the write end of a pipe
  zygote -> client      b"pid N", or b"error MESSAGE"

A client's rank cannot become the client's child, so it is forked by a
keeper, which stays its parent: it writes the rank's wait status (4 bytes,
native order) on the pipe when the rank exits, and kills the rank's process
group when the pipe's read end closes (the client died). The rank dies with
its keeper (PR_SET_PDEATHSIG). End of file on a client's socket ends that
client only; on the owner's socket, the zygote.

A rank differs from a fresh interpreter in what MODULES did at import with
that shared environment: they must not read per-rank variables (RANK,
LOCAL_RANK, ...) then, and must start no thread (a thread does not survive
fork; the zygote refuses to serve if one was started). The objects the
imports made are frozen (gc.freeze(), as the gc module's documentation
advises before fork without exec): the rank's collector, and its
finalization at exit, do not walk them, which would copy every page of the
zygote's heap into the rank (about 0.9 s of CPU per rank with torch
imported); gc.get_objects() in a rank lists only the rank's own objects.
"""

import gc
import os
import select
import socket
import struct
import sys

_MAX_REQUEST = 1 << 20  # a rank's argv and environment, bytes
_REPARENT_TIMEOUT_S = 10.0


def _preload(modules):
    """Imports `modules`; returns None or the error neuronrun reports."""
    for name in modules:
        try:
            __import__(name)
        except BaseException as e:  # noqa: BLE001 (SystemExit from a module too)
            return f"importing {name} failed: {type(e).__name__}: {e}"
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return (f"importing {', '.join(modules)} started {threads - 1} thread(s); "
                "a forked rank would inherit a broken copy of them")
    gc.collect()
    gc.freeze()  # the ranks' collections leave the imported objects alone
    return None


def _parse(data):
    """A rank's request: neuronrun's pid, the CPU, argv, and (working
    directory, environment)."""
    fields = data.decode("utf-8", "surrogateescape").split("\0")
    parent, cpu, cwd, argc = int(fields[0]), int(fields[1]), fields[2], int(fields[3])
    argv = fields[4:4 + argc]
    env = dict(e.split("=", 1) for e in fields[4 + argc:] if "=" in e)
    return parent, cpu, argv, (cwd, env)


def _become_rank(parent, cpu, argv, env, out, err):
    """In the rank, before its program runs: what neuronrun's fork+exec does
    (launcher/src/child_process.cc), for an interpreter already running."""
    import ctypes
    import signal
    import time
    os.setpgid(0, 0)
    deadline = time.monotonic() + _REPARENT_TIMEOUT_S
    while os.getppid() != parent:  # the middle process is exiting
        if time.monotonic() > deadline:
            os._exit(127)
        time.sleep(0.0002)
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(127)  # neuronrun died before prctl
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    cwd, variables = env
    os.chdir(cwd)  # neuronrun's, as for a rank it execs
    os.environ.clear()
    os.environ.update(variables)
    _reseed()


def _reseed():
    """Fresh interpreters seed their generators from the OS; forked ranks
    would share the zygote's state. `random` reseeds itself at fork."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run(argv):
    """Runs SCRIPT or -m MODULE as __main__, as the interpreter would;
    returns the exit status."""
    import runpy
    if argv and argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        sys.path[0] = os.getcwd()
        target, runner = argv[1], runpy.run_module
        kwargs = {"run_name": "__main__", "alter_sys": True}
    elif argv and argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        sys.path[0] = ""
        target, runner, kwargs = argv[1], _run_code, {}
    else:
        script = argv[0]
        if not os.path.exists(script):
            sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: "
                             "[Errno 2] No such file or directory\n")
            return 2
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        target, runner, kwargs = script, runpy.run_path, {"run_name": "__main__"}
    try:
        runner(target, **kwargs)
    except SystemExit:
        raise
    except BaseException:
        kind, value, tb = sys.exc_info()
        while tb is not None and not _in_program(tb):
            tb = tb.tb_next  # drop the zygote's and runpy's frames
        sys.excepthook(kind, value.with_traceback(tb), tb)
        if kind is KeyboardInterrupt:  # as the interpreter: die by SIGINT
            import signal
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 1
    return 0


def _run_code(code):
    """python -c CODE: CODE run as a new __main__ module."""
    import types
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    exec(compile(code, "<string>", "exec"), vars(main))


def _in_program(tb):
    name = tb.tb_frame.f_code.co_filename
    return not (name == __file__ or "runpy" in os.path.basename(name)
                or name.startswith("<frozen runpy"))


def _fork_rank(request, fds, sockets):
    """Forks the rank through a middle process; returns its pid in the
    zygote, or the rank's argv in the rank."""
    parent, cpu, argv, env = _parse(request)
    middle, pipe_r, pipe_w = _fork_with_pipe()
    if middle == 0:
        _middle(sockets, pipe_r, pipe_w, (parent, cpu, argv, env, fds[0], fds[1]))
        return argv  # in the rank
    pid = _read_pid(pipe_r, pipe_w)
    os.waitpid(middle, 0)
    if not pid:
        raise OSError("the middle process could not fork the rank")
    return pid


def _fork_with_pipe():
    """Flushes and forks; returns (pid, pipe_r, pipe_w): the child reports
    the rank's pid on the pipe."""
    sys.stdout.flush()
    sys.stderr.flush()
    pipe_r, pipe_w = os.pipe()
    try:
        return os.fork(), pipe_r, pipe_w
    except BaseException:
        os.close(pipe_r)
        os.close(pipe_w)
        raise


def _read_pid(pipe_r, pipe_w):
    """In the zygote: the pid the child reported (0: none)."""
    os.close(pipe_w)
    with os.fdopen(pipe_r, "rb") as f:
        return int(f.read() or b"0")


def _middle(sockets, pipe_r, pipe_w, rank_args):
    """The middle process: forks the rank, writes its pid (nothing if the
    fork failed) and exits, whatever happens; returns only in the rank."""
    rank = -1
    try:
        os.close(pipe_r)
        rank = os.fork()
        if rank == 0:
            os.close(pipe_w)
            for s in sockets:
                s.detach()  # its descriptor is closed with the others
            _become_rank_or_die(*rank_args)
            return  # the rank goes on to its program
        os.setpgid(rank, rank)  # also in the rank: whichever runs first
        os.write(pipe_w, str(rank).encode())
    finally:
        if rank != 0:
            os._exit(0)


def _become_rank_or_die(parent, cpu, argv, env, out, err):
    """_become_rank, or the reason it failed on the rank's stderr and exit
    127 (as an exec that failed)."""
    try:
        _become_rank(parent, cpu, argv, env, out, err)
    except BaseException as e:  # noqa: BLE001
        os.write(err, f"neuronrun --preload: cannot start the rank: {type(e).__name__}: "
                      f"{e}\n".encode())
        os._exit(127)


def _keep_rank(request, fds, sockets):
    """Forks a shared zygote's client's rank through a keeper that stays its
    parent; returns the rank's pid in the zygote, or its argv in the rank."""
    _, cpu, argv, env = _parse(request)
    out, err, status = fds
    keeper, pipe_r, pipe_w = _fork_with_pipe()
    if keeper == 0:
        for s in sockets:
            s.detach()  # closed below, by number: no object may close a reused one
        _keeper(pipe_w, (cpu, argv, env, out, err), status, keep={pipe_w, out, err, status})
        return argv  # in the rank
    pid = _read_pid(pipe_r, pipe_w)
    if not pid:
        raise OSError("the keeper could not fork the rank")
    return pid


def _keeper(pipe_w, rank_args, status, keep):
    """The keeper: forks the rank, writes its pid, then reports its wait
    status on `status` (or kills it when the client is gone) and exits,
    whatever happens; returns only in the rank."""
    rank = -1
    try:
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd > 2 and fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the listing's own descriptor
        cpu, argv, env, out, err = rank_args
        rank = os.fork()
        if rank == 0:
            _become_rank_or_die(os.getppid(), cpu, argv, env, out, err)
            return  # the rank goes on to its program
        os.setpgid(rank, rank)  # also in the rank: whichever runs first
        os.write(pipe_w, str(rank).encode())
        for fd in (pipe_w, out, err):
            os.close(fd)  # the rank's pipes end with the rank
        _report(rank, status)
    finally:
        if rank != 0:
            os._exit(0)


def _report(rank, status):
    """Waits for `rank` or for the client to go (the status pipe's read end
    closed); writes the rank's wait status, or kills its process group."""
    import signal
    pidfd = os.pidfd_open(rank)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(status, 0)  # POLLERR: no reader any more
    while not any(fd == pidfd for fd, _ in poller.poll()):
        try:
            os.killpg(rank, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, code = os.waitpid(rank, 0)
    try:
        os.write(status, struct.pack("=i", code))
    except OSError:
        pass  # the client is gone


def _answer(sock, fds, sockets, request):
    """A rank for `sock`: its pid, or why not; the rank's argv in the rank."""
    owner = sock is sockets[0]
    want = 2 if owner else 3
    try:
        if len(fds) != want:
            raise ValueError(f"a request carried {len(fds)} descriptors, not {want}")
        if owner:
            return _fork_rank(request, fds, sockets)
        return _keep_rank(request, fds, sockets)
    except Exception as e:  # noqa: BLE001 (reported to neuronrun)
        return f"error {type(e).__name__}: {e}"


def _reap_keepers(block=False):
    """Reaps the keepers that exited (with `block`, waits for all)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _hello(modules, env):
    """What a client gets first: the modules, the environment they were
    imported with (as the zygote started), an empty field, and what the
    imports set in it themselves (torch sets TORCHINDUCTOR_CACHE_DIR):
    neuronrun serves a job from here only when its own environment agrees
    (launcher/src/zygote.h)."""
    entries = [f"{k}={v}" for k, v in env.items()]
    set_here = [f"{k}={v}" for k, v in os.environ.items() if env.get(k) != v]
    return "\0".join(["zygote", ",".join(modules), _namespaces(), *entries, "",
                      *set_here]).encode("utf-8", "surrogateescape")


def _namespaces():
    """The namespaces a rank forked here runs in (its network, mounts,
    ...): "net:[4026531840],uts:[...],..." as /proc/self/ns names them."""
    names = []
    for kind in sorted(os.listdir("/proc/self/ns")):
        try:
            names.append(os.readlink(f"/proc/self/ns/{kind}"))
        except OSError:
            pass
    return ",".join(names)


def _accept(listener):
    """A client connecting to --listen's socket, if it runs as our user."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return None  # gone already, or no descriptor left: it finds no zygote
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                        struct.calcsize("3i")))
    if uid != os.getuid():
        conn.close()  # a stranger: refused
        return None
    return conn


def _serve(owner, modules, env, listener=None):
    """Answers requests until the owner closes its socket; returns the argv
    of a rank (in a forked rank), or None (in the zygote, at the end)."""
    sockets = [owner] + ([listener] if listener else [])  # then the clients'
    poller = select.poll()
    for s in sockets:
        poller.register(s, select.POLLIN)
    hello = _hello(modules, env)  # the same for every client
    while True:
        for fd, _ in poller.poll():
            sock = next(s for s in sockets if s.fileno() == fd)
            if sock is listener:
                _admit(_accept(listener), hello, sockets, poller)
                continue
            request, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 3)
            if sock is owner and request == b"connect" and len(fds) == 1:
                _admit(socket.socket(fileno=fds[0]), hello, sockets, poller)
            elif not request and sock is owner:
                _reap_keepers(block=True)  # none is left to its grandparent
                return None
            elif not request:  # a client gone
                poller.unregister(sock)
                sockets.remove(sock)
                sock.close()
            else:
                result = _answer(sock, fds, sockets, request)
                if isinstance(result, list):
                    return result  # the rank: its descriptors are 1 and 2 now
                _reply(sock, owner, fds, result)
        _reap_keepers()


def _admit(client, hello, sockets, poller):
    """Says hello to a new client and serves it from now on."""
    if client is None:
        return
    try:
        client.send(hello)
    except OSError:
        client.close()
        return
    sockets.append(client)
    poller.register(client, select.POLLIN)


def _reply(sock, owner, fds, result):
    for f in fds:
        os.close(f)
    try:
        sock.send(result.encode() if isinstance(result, str) else f"pid {result}".encode())
    except OSError:
        if sock is owner:
            raise
        # A client gone before its answer: its end of file comes next.


def _listen(path):
    """--listen PATH: a socket that clients of our user may connect to."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    return listener


def main():
    fd, modules = int(sys.argv[1]), [m for m in sys.argv[2].split(",") if m]
    env = dict(os.environ)  # before the imports, which may set some (TORCHINDUCTOR_CACHE_DIR)
    sock = socket.socket(fileno=fd)
    listener = None
    try:
        if len(sys.argv) > 4 and sys.argv[3] == "--listen":
            listener = _listen(sys.argv[4])
    except OSError as e:
        sock.send(f"error cannot listen on {sys.argv[4]}: {e}".encode())
        return 1
    error = _preload(modules)
    if error:
        sock.send(f"error {error}".encode())
        return 1
    sock.send(b"ready")
    argv = _serve(sock, modules, env, listener)
    if argv is None:  # the job is over: no interpreter teardown (a second of CPU)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return _run(argv)


if __name__ == "__main__":
    sys.exit(main())
