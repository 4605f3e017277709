"""neuronrun matrix: the smoke matrix as real jobs (CSV, report, resume), a tp
scaled from two recordings, the upstream-API example's cells, expert-parallel
cells, and bad matrix files refused before any job starts, naming file, line
and field."""
import csv
import os
import re
import subprocess

NEURONRUN = os.environ["NEURONRUN"]
SOURCE = os.environ["NEURON_SOURCE_DIR"]


def matrix(path, out, timeout=600, env=None):
    return subprocess.run([NEURONRUN, "matrix", str(path), "--out", str(out)],
                          capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else {**os.environ, **env})


def test_smoke_matrix_runs_every_cell_reports_and_resumes(tmp_path):
    smoke = os.path.join(SOURCE, "configs/scaling/smoke.textproto")
    proc = matrix(smoke, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("[matrix smoke] 16 cells: 16 completed or modelled (0 from an earlier run), 0 failed"
            in proc.stdout)
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    real = [r for r in rows if r["world"] != "8"]
    modelled = [r for r in rows if r["world"] == "8"]
    assert len(real) == 12 and all(r["status"] == "completed" for r in real), rows
    for r in real:
        assert float(r["modelled_step_us"]) > 0 and float(r["wall_step_ms"]) > 0, r
        assert float(r["compute_us"]) > 0 and r["scaling_efficiency"], r
        assert int(r["world"]) == int(r["dp"]), r
        # Its own trace replayed gives its modelled step time.
        assert abs(float(r["replayed_step_us"]) - float(r["modelled_step_us"])) <= 0.011, r
    base = {(r["zero"], r["compile"]): r for r in rows if r["world"] == "1"}
    assert len(base) == 4 and all(float(b["scaling_efficiency"]) == 1 for b in base.values())
    # The contract (docs/parallel.md, "What matches what"): on one path
    # (compiled or eager) ZeRO-3 loses exactly what plain data parallel loses
    # at every size (same kernels, fixed reduction order); the compiled path
    # against eager is held to the fp32 tolerance, since the executor's
    # kernels need not round like torch's CPU ones.
    by_path = {}
    for r in real:
        by_path.setdefault((r["world"], r["compile"]), set()).add(r["loss"])
    assert all(len(v) == 1 for v in by_path.values()), by_path
    for world in {r["world"] for r in real}:
        eager, compiled = (float(next(iter(by_path[(world, c)]))) for c in ("0", "1"))
        # fp32 rtol 1.3e-6 / atol 1e-5, plus the CSV's six-decimal rounding.
        assert abs(compiled - eager) <= 1e-5 + 1.3e-6 * abs(eager) + 1e-6, (world, by_path)
    # Compiled cells report their compile time: cold, then warm from the disk cache.
    for r in real:
        if r["compile"] == "1":
            assert float(r["cold_compile_ms"]) > 0 and float(r["warm_compile_ms"]) > 0, r
    # The 2-rank trace scaled up to 4 ranks: within 2% of the real 4-rank run.
    for r in real:
        if r["world"] == "4":
            assert r["scaled_from"].startswith("n1x2-"), r
            assert abs(float(r["scaled_replay_error_pct"])) <= 2.0, r
    # 8 ranks are modelled from the 4-rank cells: figures, but no loss or wall time.
    assert len(modelled) == 4 and all(r["status"] == "modelled" for r in modelled), modelled
    for r in modelled:
        assert r["modelled_from"] == r["cell"].replace("n1x8-", "n1x4-"), r
        assert float(r["modelled_step_us"]) > 0 and r["loss"] == "" and r["wall_step_ms"] == ""
        assert float(r["scaling_efficiency"]) > 0, r
    report = (tmp_path / "report.md").read_text()
    assert "# Scaling matrix: smoke" in report and report.count("| completed |") == 12
    assert report.count("| modelled |") == 4
    assert "4 cells of more than 4 ranks are modelled, not run" in report
    assert "## Compile time" in report
    assert "## Replay against real runs" in report
    assert f"Made by `neuronrun matrix {smoke} --out {tmp_path}`" in report
    for png in ("efficiency.png", "breakdown.png", "memory.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert f"({png})" in report

    again = matrix(smoke, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "16 cells: 16 completed or modelled (12 from an earlier run), 0 failed" in again.stdout
    assert "running" not in again.stdout


def run_matrix(text, spec, out):
    """Runs the matrix `text` (written to `spec`) into `out`: its rows by cell."""
    spec.write_text(text)
    proc = matrix(spec, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["cell"]: r for r in csv.DictReader(open(out / "results.csv"))}


TP_MATRIX = """name: "tp"
steps: 2
batch: 4
max_real_ranks: {max_real}
ranks_per_node: [4, 8]
strategies {{ name: "tp2" tp: 2 }}
strategies {{ name: "tp4" tp: 4 }}
models {{ name: "tiny" dim: 32 layers: 2 heads: 4 seq: 16 vocab: 64 }}
"""


def test_a_tp_no_cell_records_with_two_replicas_is_scaled_from_two_recordings(tmp_path):
    def run(max_real):
        return run_matrix(TP_MATRIX.format(max_real=max_real), tmp_path / "tp.textproto",
                          tmp_path / "out")

    # Modelled: no tp 4 recording has 2 replicas, so tp 4 on 8 ranks is the
    # 4-rank tp 4 and tp 2 traces scaled.
    rows = run(4)
    modelled = rows["n1x8-tp4-tiny-eager-default"]
    assert modelled["status"] == "modelled", modelled
    assert (modelled["modelled_from"] ==
            "n1x4-tp4-tiny-eager-default+n1x4-tp2-tiny-eager-default"), modelled
    assert modelled["tp"] == "4" and modelled["dp"] == "2", modelled
    assert rows["n1x8-tp2-tiny-eager-default"]["modelled_from"] == "n1x4-tp2-tiny-eager-default"
    # All real (the 4-rank cells kept from the run above, the modelled ones
    # run now): tp 4 on 8 ranks checks the tp 4 trace of one replica scaled
    # with the 8-rank tp 2 trace against its own run; the model above
    # predicted what it did.
    real = run(8)["n1x8-tp4-tiny-eager-default"]
    assert real["status"] == "completed", real
    assert real["scaled_from"] == "n1x4-tp4-tiny-eager-default+n1x8-tp2-tiny-eager-default", real
    assert abs(float(real["scaled_replay_error_pct"])) <= 2.0 and real["replay_error"] == "", real
    step, want = float(modelled["modelled_step_us"]), float(real["modelled_step_us"])
    assert abs(step - want) <= 0.02 * want, (step, want)


PP_MATRIX = """name: "pp"
steps: 2
batch: 4
max_real_ranks: {max_real}
ranks_per_node: [4, 8]
strategies {{ name: "pp2" pp: 2 }}
strategies {{ name: "pp4" pp: 4 }}
models {{ name: "tiny" dim: 32 layers: 4 heads: 4 seq: 16 vocab: 64 }}
"""


def test_a_deeper_pipeline_is_scaled_from_a_recording_at_a_smaller_pp(tmp_path):
    def run(max_real):
        return run_matrix(PP_MATRIX.format(max_real=max_real), tmp_path / "pp.textproto",
                          tmp_path / "out")

    # Modelled: pp 4 on 8 ranks from the 4-rank pp 2 trace.
    modelled = run(4)["n1x8-pp4-tiny-eager-default"]
    assert modelled["status"] == "modelled", modelled
    assert modelled["modelled_from"] == "n1x4-pp2-tiny-eager-default", modelled
    assert modelled["pp"] == "4" and modelled["dp"] == "2", modelled
    # All real (the 4-rank cells kept from the run above): each pp 4 cell
    # (one replica on 4 ranks, two on 8) checks a pp 2 trace (with 2 and 4
    # replicas) regrouped into 4 stages against its own run, and the model
    # above predicted what the 8-rank one did.
    rows = run(8)
    for ranks, source in (("4", "n1x4-pp2-tiny-eager-default"),
                          ("8", "n1x8-pp2-tiny-eager-default")):
        real = rows[f"n1x{ranks}-pp4-tiny-eager-default"]
        assert real["status"] == "completed" and real["scaled_from"] == source, real
        assert abs(float(real["scaled_replay_error_pct"])) <= 0.01, real
        assert real["replay_error"] == "", real
    step = float(modelled["modelled_step_us"])
    want = float(rows["n1x8-pp4-tiny-eager-default"]["modelled_step_us"])
    assert abs(step - want) <= 1e-3 * want, (step, want)


def test_the_upstream_example_runs_as_matrix_cells_eager_and_compiled(tmp_path):
    spec = os.path.join(SOURCE, "configs/scaling/upstream.textproto")
    proc = matrix(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ("[matrix upstream] 12 cells: 12 completed or modelled (0 from an earlier run), "
            "0 failed") in proc.stdout
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    real = [r for r in rows if r["status"] == "completed"]
    assert len(real) == 8, rows
    for r in real:
        assert float(r["modelled_step_us"]) > 0 and float(r["compute_us"]) > 0, r
        assert float(r["model_state_mib"]) > 0, r  # FSDP2's shards
        assert r["tp"] == ("2" if r["strategy"] == "fsdp2-tp2" else "1"), r  # the layout ran
        assert abs(float(r["replayed_step_us"]) - float(r["modelled_step_us"])) <= 0.011, r
        if r["compile"] == "1":
            assert float(r["cold_compile_ms"]) > 0, r
        # Device memory by phase: the weights at load, the optimizer state
        # and activations on top in the first step, the steps after no lower
        # than what the first step left.
        load, warmup, step = (float(r[f"peak_allocated_mib_{p}"]) for p in ("load", "warmup", "step"))
        assert 0 < load < warmup and step > 0, r
    report = open(tmp_path / "report.md").read()
    assert "## Device memory by phase" in report and "| cell | load | warmup | step |" in report
    # Compiled blocks train as eager: every step's loss (printed to 4
    # decimals) in each cell's log, and nothing of the compiled cells' step
    # runs on the CPU (FSDP2's and TP's collectives between device graphs).
    for r in real:
        if r["compile"] == "1":
            compiled = cell_log(tmp_path, r["cell"])
            eager = cell_log(tmp_path, r["cell"].replace("-compiled-", "-eager-"))
            steps = [step_losses(compiled), step_losses(eager)]
            assert len(steps[0]) == len(steps[1]) == 2, (compiled, eager)
            # Step 0's forward to the printing's rounding; after AdamW's
            # first update (about lr x sign(g) per weight, which magnifies
            # the last bits in which the gradients differ) 1e-3.
            assert abs(steps[0][0] - steps[1][0]) <= 2e-4, (r["cell"], steps)
            assert abs(steps[0][1] - steps[1][1]) <= 1e-3, (r["cell"], steps)
            line = re.search(r"\[rank 0\]: compiled: (\d+) device graphs on rank 0 .*; between "
                             r"them: (.*); on the CPU: (.*)$", compiled, re.M)
            tp = r["tp"] == "2"  # tensor parallel: blocks split at its all-reduces
            assert line and int(line.group(1)) >= (8 if tp else 1), compiled
            assert ("_c10d_functional.all_reduce" in line.group(2)) == tp, line.group(0)
            assert line.group(3) == "nothing", line.group(0)
    modelled = [r for r in rows if r["status"] == "modelled"]
    assert len(modelled) == 4 and all(float(r["modelled_step_us"]) > 0 for r in modelled)
    # FSDP2's 2-rank trace scaled up to its 4-rank cell: within 2%.
    for r in real:
        if r["world"] == "4" and r["strategy"] == "fsdp2":
            assert abs(float(r["scaled_replay_error_pct"])) <= 2.0, r


def test_expert_parallel_cells_run_and_more_replicas_are_modelled(tmp_path):
    # configs/scaling/moe.textproto without its 2-rank cells (for time):
    # example 09 at ep 1 and ep 2 on 4 ranks, the 8-rank cells modelled from
    # their traces.
    text = open(os.path.join(SOURCE, "configs/scaling/moe.textproto")).read()
    assert "ranks_per_node: [2, 4, 8]" in text
    text = text.replace("ranks_per_node: [2, 4, 8]", "ranks_per_node: [4, 8]").replace(
        '"examples/09_moe_gpt.py"', '"{}"'.format(os.path.join(SOURCE, "examples/09_moe_gpt.py")))
    rows = run_matrix(text, tmp_path / "moe.textproto", tmp_path / "out")
    cell = "n1x{}-ep{}-tiny_moe-eager-default".format
    for ep in (1, 2):
        r = rows[cell(4, ep)]
        assert r["status"] == "completed" and r["ep"] == str(ep) and r["dp"] == "4", r
        # Its own trace (a replica's ep x tp ranks as its positions) replayed:
        # its modelled step.
        assert abs(float(r["replayed_step_us"]) - float(r["modelled_step_us"])) <= 0.011, r
        modelled = rows[cell(8, ep)]
        assert modelled["status"] == "modelled", modelled
        assert modelled["modelled_from"] == cell(4, ep), modelled
        assert modelled["dp"] == "8" and modelled["ep"] == str(ep), modelled
        assert float(modelled["modelled_step_us"]) > 0, modelled
        # The token exchanges: all-to-alls at ep 2, none at ep 1.
        for row in (r, modelled):
            assert (row["bytes_per_step_alltoall"] != "") == (ep == 2), row
    # ep carved out of dp trains the same model on the same shards.
    one, two = (float(rows[cell(4, ep)]["loss"]) for ep in (1, 2))
    assert abs(one - two) <= 1e-4, (one, two)
    assert "| 1 x 1 x 8 (ep 2) |" in (tmp_path / "out" / "report.md").read_text()


def cell_log(out, cell):
    return (out / "cells" / cell / "output.log").read_text()


def step_losses(log):
    return [float(v) for v in re.findall(r"\[rank 0\]: step \d: loss (\d+\.\d+)", log)]


def test_a_failing_cell_is_reported_and_the_matrix_goes_on(tmp_path):
    spec = tmp_path / "m.textproto"
    # The matrix accepts a vocabulary of 1 but the trainer's dataset refuses it.
    spec.write_text('name: "f" steps: 2 batch: 2 ranks_per_node: [1]\n'
                    'strategies { name: "dp" }\n'
                    'models { name: "ok" dim: 16 layers: 1 heads: 2 seq: 8 vocab: 32 }\n'
                    'models { name: "bad" dim: 16 layers: 1 heads: 2 seq: 8 vocab: 1 }\n')
    proc = matrix(spec, tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 cells: 1 completed or modelled (0 from an earlier run), 1 failed" in proc.stdout
    rows = {r["model"]: r for r in csv.DictReader(open(tmp_path / "out" / "results.csv"))}
    assert rows["ok"]["status"] == "completed" and rows["bad"]["status"] == "failed", rows
    assert "InvalidUsageError: synthetic tokens: need sequences >= 0, length >= 1, vocab >= 2" \
        in rows["bad"]["error"], rows
    assert "## Failed cells" in (tmp_path / "out" / "report.md").read_text()


# Bad matrix files and the message each must give (file:line: field: ...).
BAD_MATRICES = [
    ('name: "x"\nranks_per_node: [4]\nstrategies { name: "a" }\nmodels { dim: 16 layers: 1 '
     'heads: 2 }\nbogus: 3\n', r"line 5, column \d+: .*bogus"),
    ('name: "x"\nranks_per_node: [6]\nstrategies { name: "a" tp: 4 }\nmodels { dim: 16 '
     'layers: 1 heads: 4 }\n', r"m.textproto:3: strategies\[0\].tp: tp x pp = 4 x 1 does "
                               r"not divide 6 ranks"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" tp: 2 }\nmodels { dim: 18 '
     'layers: 1 heads: 3 }\n', r"m.textproto:4: models\[0\].heads: 3 heads are not "
                               r"divisible by strategy a's tp 2"),
    ('name: "x"\nranks_per_node: [2]\ntopologies: "configs/topologies/nope.textproto"\n'
     'strategies { name: "a" }\nmodels { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: topologies: no topology file .*nope.textproto"),
    ('name: "x"\nmax_real_ranks: 2\nranks_per_node: [1, 4]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:2: max_real_ranks: cell n1x4-a-d16_l1-eager-default \(4 ranks\) is "
     r"modelled, but no real cell .* has at least 2 data-parallel ranks to record"),
    # Numbers past their bounds, and products that would overflow, are refused up front.
    ('name: "x"\nranks_per_node: [4]\nstrategies { name: "a" tp: 65536 pp: 65536 }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: strategies\[0\].pp: must be 1 to 65536, got 65536|"
     r"m.textproto:3: strategies\[0\].tp: tp x pp = 65536 x 65536 does not divide 4 ranks"),
    ('name: "x"\nnodes: [2147483647]\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:2: nodes: must be 1 to 4096, got 2147483647"),
    ('name: "x"\nnodes: [4096]\nranks_per_node: [65536]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: ranks_per_node: 4096 nodes x 65536 ranks per node = 268435456 ranks, "
     r"more than the 65536 a matrix cell may have"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: -2 }\n',
     r"m.textproto:4: models\[0\].heads: must be 1 to 16, got -2"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 seq: -8 }\n',
     r"m.textproto:4: models\[0\].seq: must be 1 to 1048576, got -8"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 vocab: -5 }\n',
     r"m.textproto:4: models\[0\].vocab: must be 1 to 16777216, got -5"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 1000000000 layers: 1 heads: 2 }\n',
     r"m.textproto:4: models\[0\].dim: must be 1 to 65536, got 1000000000"),
    # An explicit 0 is an error, not the default.
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" tp: 0 }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: strategies\[0\].tp: must be 1 to 65536, got 0"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1\n heads: 0 }\n',
     r"m.textproto:5: models\[0\].heads: must be 1 to 16, got 0"),
    ('name: "x"\nranks_per_node: [2]\nbatch: 0\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: batch: must be 1 to 1048576, got 0"),
    # Expert parallelism: its model, its divisors, and no larger ep modelled.
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" ep: 2 }\n'
     'models { dim: 16 layers: 1 heads: 2 }\n',
     r"m.textproto:3: strategies\[0\].ep: expert parallelism \(ep 2\) needs a model with "
     r"experts; model d16-l1 has none"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" ep: 4 }\n'
     'models { dim: 16 layers: 1 heads: 2 experts: 8 }\n',
     r"m.textproto:3: strategies\[0\].ep: ep 4 does not divide the 2 data-parallel ranks"),
    ('name: "x"\nranks_per_node: [6]\nstrategies { name: "a" ep: 3 }\n'
     'models { dim: 16 layers: 1 heads: 2 experts: 8 }\n',
     r"m.textproto:4: models\[0\].experts: 8 experts are not divisible by strategy a's "
     r"ep 3"),
    ('name: "x"\nranks_per_node: [2]\nstrategies { name: "a" }\n'
     'models { dim: 16 layers: 1 heads: 2 experts: 2 top_k: 3 }\n',
     r"m.textproto:4: models\[0\].top_k: must be 1 to 2, got 3"),
    ('name: "x"\nmax_real_ranks: 4\nranks_per_node: [4, 8]\nstrategies { name: "a" ep: 4 '
     '}\nmodels { dim: 16 layers: 1 heads: 2 experts: 8 }\n',
     r"m.textproto:2: max_real_ranks: cell n1x8-a-d16_l1-eager-default \(8 ranks, ep 4\) "
     r"is modelled, but no real cell .* has 2 replicas of its ep x tp = 4 ranks to record "
     r"\(8 ranks or more\): a replay adds replicas of a recorded ep, it does not model a "
     r"larger ep"),
]


def test_bad_matrix_files_are_refused_naming_file_line_and_field(tmp_path):
    import re
    for text, pattern in BAD_MATRICES:
        spec = tmp_path / "m.textproto"
        spec.write_text(text)
        proc = matrix(spec, tmp_path / "out")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert re.search(pattern, proc.stderr), (pattern, proc.stderr)
        assert not (tmp_path / "out").exists()


def test_a_trainer_whose_figures_do_not_parse_fails_its_cell_naming_the_line(tmp_path):
    # The trainer's figures are a RunFigures text proto: a trainer writing
    # anything else (here the old "key = value" lines) fails its cell.
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        "import sys\n"
        "out = sys.argv[sys.argv.index('--metrics-out') + 1]\n"
        "open(out, 'w').write('modelled_step_us: 12.5\\nloss = 1.0\\n')\n")
    spec = tmp_path / "m.textproto"
    spec.write_text(f'name: "p" script: "{trainer}" steps: 2 batch: 2 ranks_per_node: [1]\n'
                    'strategies { name: "dp" }\n'
                    'models { name: "m" dim: 16 layers: 1 heads: 2 seq: 8 vocab: 32 }\n')
    proc = matrix(spec, tmp_path / "out", env={"NEURON_PRELOAD": ""})  # it imports no torch
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert row["status"] == "failed", row
    assert "metrics.textproto: line 2, column" in row["error"], row
    assert row["modelled_step_us"] == "" and row["loss"] == "", row
