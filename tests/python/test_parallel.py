"""torchneuron.parallel: the layout, the sampler, the synthetic data and the
package's own DistributedDataParallel. In-process checks first; then three
real jobs under neuronrun (few and purposeful: a Python rank spends ~1.5 s
of CPU importing torch)."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.utils.data

NEURONRUN = os.environ["NEURONRUN"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "python"))
import torchneuron  # noqa: E402
import torchneuron.parallel as parallel  # noqa: E402
from torchneuron import _C  # noqa: E402

SCRIPTS = os.path.join(os.environ["NEURON_SOURCE_DIR"], "tests/python/scripts")


def run(n, script, *args, timeout=300):
    return subprocess.run([NEURONRUN, "-n", str(n), os.path.join(SCRIPTS, script), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_sampler_yields_torchs_indices(shuffle, drop_last):
    dataset = list(range(103))
    for replicas in (1, 2, 3, 8, 200):
        for rank in {0, replicas // 2, replicas - 1}:
            ours = parallel.DistributedSampler(dataset, replicas, rank, shuffle, 9, drop_last)
            theirs = torch.utils.data.DistributedSampler(dataset, replicas, rank, shuffle, 9,
                                                         drop_last)
            for epoch in (0, 1, 5):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs), (replicas, rank, epoch)
                assert len(ours) == len(theirs)


def test_layout_errors_name_the_sizes():
    with pytest.raises(torchneuron.InvalidUsageError,
                       match=r"world size 6 is not divisible by tp x pp = 4 x 1 = 4"):
        _C._MeshLayout(6, 4, 1, 0)
    with pytest.raises(torchneuron.InvalidUsageError, match=r"but the world size is 16"):
        _C._MeshLayout(16, 2, 2, 3)
    layout = parallel.Layout(16, 2, 2, None or 0, 5)
    assert (layout.tp, layout.dp, layout.pp) == (2, 4, 2)
    assert layout.group_ranks("data") == [1, 3, 5, 7]
    assert layout.group_ranks("pipeline") == [5, 13]
    with pytest.raises(RuntimeError, match="call torch.distributed.init_process_group first"):
        parallel.initialize(tp=2)
    with pytest.raises(RuntimeError, match="not initialized"):
        parallel.get_data_parallel_group()


def test_synthetic_tokens_are_deterministic_shifted_pairs():
    a = parallel.SyntheticTokenDataset(sequences=16, length=12, vocab=50, seed=4)
    b = parallel.SyntheticTokenDataset(sequences=16, length=12, vocab=50, seed=4)
    assert torch.equal(a.tokens, b.tokens) and len(a) == 16
    x, y = a[3]
    assert x.shape == y.shape == (12,) and torch.equal(x[1:], y[:-1])
    assert 0 <= int(a.tokens.min()) and int(a.tokens.max()) < 50
    assert not torch.equal(a.tokens, parallel.SyntheticTokenDataset(16, 12, 50, seed=5).tokens)


def test_layout_groups_sampler_and_ddp_on_a_3d_job():
    proc = run(8, "parallel_layout.py", "--tp", "2", "--pp", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0]: parallel layout tp=2 dp=2 pp=2: groups, sampler and DDP ok on 8 ranks" \
        in proc.stdout, proc.stdout


def test_own_ddp_trains_bitwise_like_a_single_process():
    proc = run(4, "ddp_parity.py", "--backend", "neuron", "--ddp", "torchneuron")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "ddp parity" in line]
    assert len(lines) == 5, proc.stdout
    for case, line in zip("abcde", lines):
        assert re.fullmatch(rf"\[rank 0\]: torchneuron ddp parity \({case}\) .*: 10 steps x 4 "
                            r"ranks, backend neuron: ok, \d+ checks bitwise equal to the "
                            r"reference", line), line


def test_own_ddp_works_over_gloo_too():
    proc = run(3, "ddp_parity.py", "--backend", "gloo", "--ddp", "torchneuron",
               "--tolerance", "close", "--cases", "ac")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(re.findall(r"torchneuron ddp parity \([ac]\) .*backend gloo: ok", proc.stdout)) \
        == 2, proc.stdout


def test_zero_stages_train_bitwise_like_a_single_process():
    proc = run(3, "zero_parity.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stage in (1, 2, 3):
        assert (f"[rank 0]: zero parity stage {stage}: 10 steps x 3 ranks: losses and 8 tensors "
                "bitwise equal to the reference") in proc.stdout, proc.stdout
    assert ("zero extras: clip_grad_norm_, bf16 mixed precision, cpu offload, activation "
            "checkpointing, full state dict round trip: ok") in proc.stdout, proc.stdout
    assert ("zero no_sync at stages 1-3 bitwise equal to DDP's; size policy, prefetch, bf16 "
            "reduction: ok") in proc.stdout, proc.stdout


@pytest.mark.parametrize("tp,sp", [(2, False), (4, True)])
def test_tensor_and_sequence_parallel_gpt_matches_one_device(tp, sp):
    proc = run(4, "tp_parity.py", "--tp", str(tp), *(["--sp"] if sp else []))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"[rank 0]: tp parity tp={tp} sp={sp}: 3 steps, losses and 87 gradients close to "
            "one device; rng tracker and dropout ok") in proc.stdout, proc.stdout


@pytest.mark.parametrize("args", [
    ["--pp", "2", "--schedule", "1f1b", "--microbatches", "3"],
    ["--pp", "2", "--tp", "2", "--schedule", "gpipe", "--microbatches", "4", "--sp",
     "--clip", "0.05"],
    ["--pp", "2", "--schedule", "interleaved", "--chunks", "2", "--microbatches", "5"],
])
def test_pipeline_schedules_match_one_device(args):
    proc = run(4, "pp_parity.py", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\[rank 0\]: pp parity .*: ok, \d+ checks close to one device; stage 0 "
                     r"modelled bubble 0\.\d+", proc.stdout), proc.stdout


def test_3d_tensor_pipeline_and_zero_data_parallel_match_one_device():
    # ZeRO stages 1 and 3 (one job, one after the other) with sequence
    # parallelism and clipping across all three axes.
    proc = run(8, "pp_parity.py", "--pp", "2", "--tp", "2", "--zero", "1,3", "--sp", "--clip",
               "0.05")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for zero in (1, 3):
        assert re.search(rf"\[rank 0\]: pp parity pp=2 tp=2 dp=2 zero={zero} .*: ok, \d+ checks "
                         r"close to one device; stage 0 modelled bubble 0\.\d+", proc.stdout), \
            proc.stdout


def _tiny_gpt(seed, dim=16):
    from torchneuron.models.gpt import GPT, GPTConfig
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=20, seq_len=4, dim=dim, heads=2, layers=1), tp_group=False)


def test_checkpoint_round_trip_and_refusals(tmp_path):
    model = _tiny_gpt(1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 20, (2, 4))
    model(tokens, tokens).backward()
    opt.step()
    parallel.save_checkpoint(str(tmp_path), model, optimizer=opt, step=7)
    other = _tiny_gpt(2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    assert parallel.load_checkpoint(str(tmp_path), other, optimizer=other_opt) == 7
    for (n, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), n
    for p, q in zip(model.parameters(), other.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], other_opt.state[q][key]), key
    full = parallel.load_full_state_dict(str(tmp_path))
    assert set(full) == set(model.state_dict()) and torch.equal(
        full["head.out.weight"], model.state_dict()["head.out.weight"])

    with pytest.raises(ValueError, match=r"tensor 'embed.tokens.weight' has shape \[20, 16\] in "
                                         r"the checkpoint but \[20, 24\] in the model"):
        parallel.load_checkpoint(str(tmp_path), _tiny_gpt(3, dim=24))

    # Saving again replaces the checkpoint: one file per rank, the old ones removed.
    parallel.save_checkpoint(str(tmp_path), model, optimizer=opt, step=8)
    assert parallel.load_checkpoint(str(tmp_path), other, optimizer=other_opt) == 8
    shards = list(tmp_path.glob("shard-*.bin"))
    assert len(shards) == 1, shards
    shard = shards[0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(torchneuron.PeerError, match=r"shard-00000-00000008-\w+.bin has .* "
                                                    r"checksum .* the file changed or is "
                                                    r"truncated"):
        parallel.load_checkpoint(str(tmp_path), other)
    (tmp_path / "manifest.textproto").unlink()
    with pytest.raises(torchneuron.InvalidUsageError,
                       match=r"no complete checkpoint in .*manifest.textproto is missing"):
        parallel.load_checkpoint(str(tmp_path), other)


def test_optimizer_state_the_checkpoint_lacks_is_an_error_unless_asked_for(tmp_path):
    model = _tiny_gpt(1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    tokens = torch.randint(0, 20, (2, 4))
    model(tokens, tokens).backward()
    opt.step()
    other = _tiny_gpt(2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    other(tokens, tokens).backward()
    other_opt.step()
    before = {k: v.clone() for k, v in other_opt.state[next(other.parameters())].items()}
    # Wholly: a model-only checkpoint does not wipe the optimizer's state.
    model_only = tmp_path / "model-only"
    parallel.save_checkpoint(str(model_only), model, step=1)
    with pytest.raises(ValueError, match=r"model-only holds no optimizer state .*"
                                         r"allow_missing_optimizer_state=True"):
        parallel.load_checkpoint(str(model_only), other, optimizer=other_opt)
    first = next(other.parameters())
    assert other_opt.state[first].keys() == before.keys()  # nothing was modified
    assert all(torch.equal(other_opt.state[first][k], v) for k, v in before.items())
    parallel.load_checkpoint(str(model_only), other, optimizer=other_opt,
                             allow_missing_optimizer_state=True)
    assert other_opt.state[first] == {}
    # Partly: an entry dropped from the manifest (its checksum recomputed).
    full = tmp_path / "full"
    parallel.save_checkpoint(str(full), model, optimizer=opt, step=2)
    m = torchneuron._C._read_manifest(str(full))
    dropped = "head.out.weight#exp_avg_sq"
    tensors = [t for t in m["tensors"] if t[0] != dropped]
    assert len(tensors) == len(m["tensors"]) - 1
    torchneuron._C._write_manifest(str(full), m["step"], m["layout"], m["files"], tensors)
    with pytest.raises(ValueError, match=r"lacks the optimizer state exp_avg_sq of parameter "
                                         r"'head.out.weight' \(it holds exp_avg, exp_avg_sq, "
                                         r"step for other parameters"):
        parallel.load_checkpoint(str(full), other, optimizer=other_opt)
    parallel.load_checkpoint(str(full), other, optimizer=other_opt,
                             allow_missing_optimizer_state=True)
    head = dict(other.named_parameters())["head.out.weight"]
    assert sorted(other_opt.state[head]) == ["exp_avg", "step"]


def test_a_keyed_checkpoint_loads_only_under_its_key(tmp_path, monkeypatch):
    model = _tiny_gpt(1)
    monkeypatch.setenv("NEURON_CHECKPOINT_SECRET", "s" * 32)
    parallel.save_checkpoint(str(tmp_path), model, step=4)
    assert "# mac hmac-sha256 " in (tmp_path / "manifest.textproto").read_text()
    other = _tiny_gpt(2)
    assert parallel.load_checkpoint(str(tmp_path), other) == 4
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    monkeypatch.setenv("NEURON_CHECKPOINT_SECRET", "t" * 32)
    with pytest.raises(RuntimeError, match=r"does not carry the MAC of its contents under "
                                      r"\$NEURON_CHECKPOINT_SECRET"):
        parallel.load_checkpoint(str(tmp_path), other)
    monkeypatch.delenv("NEURON_CHECKPOINT_SECRET")
    with pytest.raises(RuntimeError, match=r"is keyed \(HMAC-SHA256\): set \$NEURON_CHECKPOINT_SECRET"):
        parallel.load_checkpoint(str(tmp_path), other)
    monkeypatch.setenv("NEURON_CHECKPOINT_SECRET", "short")
    with pytest.raises(RuntimeError, match=r"secret from \$NEURON_CHECKPOINT_SECRET has 5 bytes"):
        parallel.save_checkpoint(str(tmp_path), model, step=5)


def test_a_save_killed_half_way_leaves_the_previous_checkpoint_loadable(tmp_path):
    directory = tmp_path / "ckpt"
    proc = run(2, "checkpoint_killed.py", "--dir", str(directory))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "[rank 1]: dying after writing shard-00001-00000002-" in proc.stdout, proc.stdout
    # The second save's shard files are there, its manifest is not: the
    # directory loads as the first save.
    assert any("-00000002-" in f.name for f in directory.glob("shard-*.bin"))
    expected = torch.load(tmp_path / "expected.pt")
    loaded = parallel.load_full_state_dict(str(directory))
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        assert torch.equal(loaded[name], value), name
    # The next complete save removes the leftovers.
    parallel.save_checkpoint(str(directory), _tiny_gpt(1), step=3)
    left = [f.name for f in directory.glob("shard-*.bin")]
    assert len(left) == 1 and "-00000003-" in left[0], list(directory.glob("*"))


def test_save_in_one_layout_load_in_another_and_continue(tmp_path):
    proc = run(4, "reshard_parity.py", "--dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("reshard parity: tp=2 dp=2 ZeRO-3 -> checkpoint -> tp=1 pp=2 dp=2 and tp=1 dp=4 "
            "ZeRO-2: 9 losses close") in proc.stdout, proc.stdout


def test_gpt_example_trains_the_same_in_a_3d_layout_as_in_plain_data_parallel():
    example = os.path.join(os.environ["NEURON_SOURCE_DIR"], "examples/04_train_gpt.py")

    def losses(n, *args):
        proc = subprocess.run([NEURONRUN, "-n", str(n), example, "--steps", "2", *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        found = re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+) \| wall [\d.]+ ms, [\d,]+ "
                           r"tokens/s \| modelled [\d.]+ us, [\d,]+ tokens/s \| max RSS \d+ MiB",
                           proc.stdout)
        assert len(found) == 2, proc.stdout
        if "--clip" in args:  # the limit is below the norm: clipping really scales
            norms = re.findall(r"\| grad norm (\d+\.\d+) \(clip 0\.3\)", proc.stdout)
            assert len(norms) == 2 and min(map(float, norms)) > 0.3, proc.stdout
        # Every rank's memory at the end: rank, tp, pp, dp, RSS, model state.
        rows = re.findall(r"\[rank 0\]: +(\d+) +\d+ +\d+ +\d+ +\d+ +(\d+\.\d+)$", proc.stdout,
                          re.MULTILINE)
        assert [int(r) for r, _ in rows] == list(range(n)), proc.stdout
        if "--zero" in args:
            assert all(float(state) > 0 for _, state in rows), rows
        return found

    # Both have 2 data-parallel ranks, so the same global batches; clipping
    # is computed over the whole model in both.
    assert losses(8, "--tp", "2", "--pp", "2", "--zero", "3", "--clip", "0.3") == \
        losses(2, "--clip", "0.3")


def test_a_pipeline_stage_that_dies_mid_step_ends_the_job_naming_it():
    import time
    start = time.monotonic()
    proc = run(2, "pipeline_rank_dies.py", timeout=120)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert "unreachable" not in proc.stdout
    assert re.search(r"job failed: rank 1 .* exited with code 7", proc.stderr), proc.stderr
    assert time.monotonic() - start < 60


def test_a_pipeline_shape_mismatch_names_the_stage_and_microbatch():
    proc = run(2, "pipeline_rank_dies.py", "--shape", timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert re.search(r"RuntimeError: pipeline stage 1 \(virtual stage 1\), microbatch 0, "
                     r"forward: mat1 and mat2 shapes cannot be multiplied \(2x4 and 5x4\)",
                     proc.stderr), proc.stderr


def test_zero_model_state_memory_is_within_ten_percent_of_the_formulas():
    bench = os.path.join(os.environ["NEURON_SOURCE_DIR"], "benchmarks/zero_memory.py")
    build = os.path.dirname(os.path.dirname(NEURONRUN))
    proc = subprocess.run([sys.executable, bench, "--build", build, "--ranks", "4"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^\s+4\s+([123])\s+\d+ \|\s+[\d.]+\s+[\d.]+\s+([\d.]+)$", proc.stdout,
                      re.MULTILINE)
    assert [stage for stage, _ in rows] == ["1", "2", "3"], proc.stdout
    offload = re.search(r"^\s+4\s+3o\s+\d+ \|\s+([\d.]+)\s+-", proc.stdout, re.MULTILINE)
    stage3 = re.search(r"^\s+4\s+3\s+\d+ \|\s+([\d.]+)", proc.stdout, re.MULTILINE)
    # Offload leaves the master, its gradient and AdamW's state (14 of 16
    # bytes a parameter over N) off the device.
    assert offload and float(offload.group(1)) < 0.25 * float(stage3.group(1)), proc.stdout
    for stage, ratio in rows:
        assert abs(float(ratio) - 1) <= 0.10, f"stage {stage}: {ratio}\n{proc.stdout}"


def test_cpp_trainer_trains_the_same_in_3d_as_in_plain_data_parallel():
    trainer = os.path.join(os.path.dirname(os.path.dirname(NEURONRUN)), "examples", "cpp_trainer")

    def losses(n, *args):
        proc = subprocess.run([NEURONRUN, "-n", str(n), trainer, "--steps", "3", *args],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        found = re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+) \|", proc.stdout)
        assert len(found) == 3, proc.stdout
        return found

    # tp 2 x pp 2 x dp 2 (1F1B over 4 microbatches), with and without ZeRO-3
    # per stage, against dp 2: the same global batches.
    plain = losses(2)
    assert losses(8, "--tp", "2", "--pp", "2") == plain
    assert losses(8, "--tp", "2", "--pp", "2", "--zero", "3", "--dp", "2") == plain
