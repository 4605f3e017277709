"""python -m torchneuron.predict: captures one training step (step.py) and
writes it as a neuron.parallel.proto.StepCapture text proto. neuronrun
predict runs it with the model and layout it has already checked; errors
go to stderr with exit status 2. With --batch FILE, each line of FILE is
one capture's arguments, tab-separated: a capture that is refused writes
its reason to its --out path plus ".error" and the others go on (neuronrun
predict --table captures every row in one process).

    python -m torchneuron.predict --layers 32 --hidden 4096 --heads 32 \\
        --kv-heads 32 --ffn-hidden 11008 --vocab 32000 --tp 8 --seq 4096 \\
        --stage-layers 32 --out /tmp/step.textproto
"""
import argparse
import sys

from ..files import write_atomically
from ..models.decoder import DecoderConfig
from .step import StepSpec, capture_step


def _arguments(argv):
    p = argparse.ArgumentParser(prog="python -m torchneuron.predict",
                                description="Capture one training step on fake tensors.")
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn-hidden", "vocab"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--activation", default="swiglu")
    p.add_argument("--norm", default="rmsnorm")
    p.add_argument("--position", default="rotary")
    p.add_argument("--max-seq", type=int, default=0)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--experts", type=int, default=0, help="a Mixture of Experts' per layer")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--capacity-factor", type=float, default=0.0)
    p.add_argument("--ep", type=int, default=1, help="expert parallel, of the dp ranks")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--zero", type=int, default=0)
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--checkpointing", default="none")
    p.add_argument("--recompute-mlp", action="store_true")
    p.add_argument("--attention", default="flash")
    p.add_argument("--dtype", default="bf16-mixed")
    p.add_argument("--stage-layers", required=True,
                   help="decoder layers per pipeline stage, comma-separated")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def _quote(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _text(value, indent):
    """A dict as text-proto fields (nested dicts as messages)."""
    pad = "  " * indent
    lines = []
    for key, v in value.items():
        if isinstance(v, dict):
            lines.append(f"{pad}{key} {{")
            lines.extend(_text(v, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(v, list):
            lines.extend(f"{pad}{key}: {x}" for x in v)
        elif isinstance(v, bool):
            lines.append(f"{pad}{key}: {'true' if v else 'false'}")
        elif isinstance(v, str):
            lines.append(f"{pad}{key}: {_quote(v)}")
        else:
            lines.append(f"{pad}{key}: {v}")
    return lines


def write_capture(result, path):
    lines = []
    for name, steps in result["phases"].items():
        lines.append("phases {")
        lines.append(f"  name: {_quote(name)}")
        for step in steps:
            lines.extend(_text({"steps": step}, 1))
        lines.append("}")
    lines.extend(_text(result["sizes"], 0))
    write_atomically(path, "\n".join(lines) + "\n")


def _capture(argv):
    a = _arguments(argv)
    model = DecoderConfig(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                          ffn_hidden=a.ffn_hidden, vocab=a.vocab, activation=a.activation,
                          norm=a.norm, position=a.position, max_seq=a.max_seq or a.seq,
                          rope_theta=a.rope_theta, experts=a.experts, top_k=a.top_k,
                          capacity_factor=a.capacity_factor)
    stages = tuple(int(x) for x in a.stage_layers.split(","))
    spec = StepSpec(model=model, tp=a.tp, seq=a.seq, micro_batch=a.micro_batch,
                    sequence_parallel=a.sequence_parallel, checkpointing=a.checkpointing,
                    recompute_mlp=a.recompute_mlp, attention=a.attention, dtype=a.dtype,
                    stage_layers=stages, dp=a.dp, zero=a.zero, ep=a.ep)
    try:
        write_capture(capture_step(spec), a.out)
    except ValueError as e:
        return a.out, f"torchneuron.predict: {e}"
    return a.out, None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["--batch"]:
        _, error = _capture(argv)
        if error:
            print(error, file=sys.stderr)
        return 2 if error else 0
    if len(argv) != 2:
        print("torchneuron.predict: --batch FILE takes nothing else", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        lines = f.read(1 << 24).splitlines()
    for line in lines:
        out, error = _capture(line.split("\t"))
        if error:
            write_atomically(out + ".error", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
