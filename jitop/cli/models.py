"""ONNX models on the command line (jitop.onnx): `jitop compile`, `jitop run`, and what `jitop tune MODEL` and
`jitop explain MODEL` do with a model.

    jitop compile model.onnx [-o model.jitop] [--shape NAME=D0,D1,... ...]
    jitop run model.onnx|model.jitop --input NAME=FILE.npy|random|zeros [...] [--shape ...] [--output out.npz]
              [--repeat N]
    jitop tune model.onnx [--budget 10m | --trials N] [--shape ...] [the other tune options]
    jitop explain model.onnx|model.jitop [--shape ...] [--full] [--no-profile]

`--shape NAME=D0,D1,...` pins an input's shape when the model is an .onnx file (jitop.onnx.load(shapes=)):
its kernel is compiled for exactly that shape. For a .jitop file, and for `random` / `zeros` inputs, it gives
the size of each symbolic dim; without it a symbolic dim is 1 (as Model.compile does).

A missing file, a malformed --shape or --input, an input name the model lacks, a shape or an array that
does not fit the model: one line on stderr and exit status 2 (jitop.cli.common.CommandError).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from jitop.cli.common import CommandError, table

MODEL_SUFFIXES = (".onnx", ".jitop")
SHAPE_HELP = ("NAME=D0,D1,...: the input's shape (.onnx: pinned, its kernel compiled for exactly it; "
              "otherwise: the size of its symbolic dims); NAME= may be left out for a one-input model")


def is_model_path(path: str | None) -> bool:
    """Whether a command's file argument names a model (by its suffix) rather than a Python script."""
    return bool(path) and os.path.splitext(str(path))[1].lower() in MODEL_SUFFIXES


def add_shape_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...", help=SHAPE_HELP)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register `jitop compile` and `jitop run`."""
    p = sub.add_parser("compile", help="compile an ONNX model into one .jitop file (code and weights)",
                       usage="jitop compile [-h] MODEL.onnx [-o OUT.jitop] [--shape NAME=D0,D1,... ...]",
                       description="Load an ONNX model, compile it for its input shapes (the --shape ones; a "
                                   "symbolic dim not given is compiled at 1) and write the executable code with the "
                                   "weights to one file that jitop.onnx.load and jitop run read without the onnx "
                                   "package (no pickle).",
                       epilog="e.g. jitop compile resnet50.onnx -o resnet50.jitop --shape data=1,3,224,224")
    p.add_argument("model", help="the .onnx model")
    p.add_argument("-o", "--output", metavar="OUT.jitop", help="the file to write (default: MODEL with .jitop)")
    add_shape_option(p)
    p.set_defaults(run=compile_command)

    p = sub.add_parser("run", help="run an ONNX model (.onnx or compiled .jitop) on .npy inputs and time it",
                       usage="jitop run [-h] MODEL --input NAME=FILE.npy|random|zeros [...] [--shape NAME=D0,D1,...] "
                             "[--output OUT.npz] [--repeat N]",
                       description="Run a model once on the given inputs; print each output's shape, dtype and "
                                   "a summary, the first call's time (which compiles an .onnx model, or finds it "
                                   "in the disk cache) and, with --repeat N, the time per run.",
                       epilog="e.g. jitop run model.onnx --input data=x.npy --output out.npz --repeat 20; "
                              "jitop run model.jitop --input data=random --shape data=8,3,224,224")
    p.add_argument("model", help="the .onnx model or a .jitop file written by jitop compile")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy|random|zeros",
                   help="an input: a .npy file, or an array of its declared shape and dtype (random: normal "
                        "floats, integers 0 and 1; zeros); once per input; NAME= may be left out for a "
                        "one-input model")
    add_shape_option(p)
    p.add_argument("--output", metavar="OUT.npz", help="save every output to this .npz, by output name")
    p.add_argument("--repeat", type=int, default=0, metavar="N", help="then time N more runs (median, min)")
    p.add_argument("--target", metavar="cuda", help="'cuda': run an .onnx model on this machine's NVIDIA GPU "
                                                     "(jitop.onnx.load(target='cuda')); default: this CPU")
    p.set_defaults(run=run_command)


# ---------------------------------------------------------------------------------------------
# opening a model, reading --shape and --input
# ---------------------------------------------------------------------------------------------

@dataclass
class Opened:
    """A model as a command opened it: the Model, its declared inputs (before any --shape), the ONNX graph
    (None for a .jitop file), the pinned shapes, and the file's size and load time."""

    path: str
    model: Any
    declared: list
    graph: Any
    shapes: dict[str, tuple[int, ...]]
    nbytes: int
    seconds: float

    @property
    def compiled(self) -> bool:
        return self.graph is None

    def input_shape(self, name: str) -> tuple[tuple[int, ...], list[str]]:
        """The shape to make an array of input `name` with (--shape, else the declared one with each symbolic
        dim at 1), and the symbols that were set to 1."""
        if name in self.shapes:
            return self.shapes[name], []
        info = next(v for v in self.declared if v.name == name)
        if info.shape is None:
            raise CommandError(f"input {name!r} has no declared shape: give it with --shape {name}=D0,D1,...")
        unset = [str(d) if d is not None else f"dim {k}" for k, d in enumerate(info.shape) if not isinstance(d, int)]
        return tuple(d if isinstance(d, int) else 1 for d in info.shape), unset


def open_model(path: str, shape_specs: Sequence[str], target: str | None = None) -> Opened:
    """Load `path` (.onnx, or a .jitop file: recognized by its content) with the --shape specs checked against
    its inputs; an .onnx model is loaded with them pinned, for `target` (None: this CPU; "cuda": the GPU).
    Every problem is a CommandError (status 2)."""
    import jitop.onnx
    from jitop.onnx import compiled
    from jitop.onnx.proto import read
    if not os.path.isfile(path):
        raise CommandError(f"model {path!r} not found (expected an .onnx model or a .jitop file)")
    start = time.perf_counter()
    with open(path, "rb") as f:
        data = f.read()
    is_compiled = compiled.is_compiled(data)
    if is_compiled and target is not None:
        raise CommandError(f"--target {target}: {path} is a compiled jitop model, which runs on the CPU it was "
                           "compiled for; give the .onnx model")
    onnx = None if is_compiled else _onnx_package(path)
    try:
        if is_compiled:
            model, graph = jitop.onnx.load(data), None
            declared = list(model.inputs)
        else:
            proto = onnx.load_from_string(data)  # parsed once: read here, and by load below
            graph = read(proto)
            declared = list(graph.inputs)
    except Exception as err:  # noqa: BLE001 - not a model, damaged, another CPU's code: one line, no traceback
        what = "cannot be loaded" if is_compiled else "is not a readable ONNX model"
        raise CommandError(f"{path} {what} ({type(err).__name__}: {_first_line(err)})") from None
    shapes = parse_shapes(shape_specs, declared)
    if graph is not None:
        try:
            model = jitop.onnx.load(proto, shapes=shapes or None, target=target)
        except Exception as err:  # noqa: BLE001 - an unsupported operator or attribute: the model is the input
            raise CommandError(f"{path}: {type(err).__name__}: {_first_line(err)}") from None
        graph.initializers = {}  # the model has its own copy; the commands read the nodes and the opset only
    return Opened(path, model, declared, graph, shapes, len(data), time.perf_counter() - start)


def _onnx_package(path: str) -> Any:
    try:
        import onnx
    except ImportError:
        raise CommandError(f"{path}: reading an .onnx model needs the onnx package: pip install 'jitop[onnx]' "
                           "(a .jitop file written by jitop compile loads without it)") from None
    return onnx


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def _spec(spec: str, declared: list, option: str, example: str) -> tuple[str, str]:
    """(input name, value) of one NAME=VALUE spec; a bare VALUE names the only input of a one-input model."""
    names = [v.name for v in declared]
    if "=" in spec:
        name, value = spec.split("=", 1)
    elif len(names) == 1:
        name, value = names[0], spec
    else:
        raise CommandError(f"{option} {spec!r}: expected NAME={example} (the model's inputs: {', '.join(names)})")
    if name not in names:
        raise CommandError(f"{option} {spec!r}: the model has no input {name!r} (its inputs: {', '.join(names)})")
    if not value:
        raise CommandError(f"{option} {spec!r}: nothing after {name}=, expected {name}={example}")
    return name, value


def parse_shapes(specs: Sequence[str], declared: list) -> dict[str, tuple[int, ...]]:
    """The --shape specs as input name -> shape, each checked against the declared input: its rank, and its
    fixed dims."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        name, value = _spec(spec, declared, "--shape", "D0,D1,... (e.g. 1,3,224,224)")
        parts = [p.strip() for p in re.split(r"[,x]", value)]
        if not all(p.isdigit() and int(p) > 0 for p in parts):
            raise CommandError(f"--shape {spec!r}: expected positive integers separated by commas, e.g. "
                               f"{name}=1,3,224,224")
        if name in shapes:
            raise CommandError(f"--shape {spec!r}: input {name!r} is given a shape twice")
        shape = tuple(int(p) for p in parts)
        info = next(v for v in declared if v.name == name)
        if info.shape is not None:
            if len(shape) != len(info.shape):
                raise CommandError(f"--shape {spec!r} does not fit the model's input {info.describe()}: it has "
                                   f"{len(info.shape)} dims, not {len(shape)}")
            for k, (d, s) in enumerate(zip(info.shape, shape)):
                if isinstance(d, int) and d != s:
                    raise CommandError(f"--shape {spec!r} does not fit the model's input {info.describe()}: dim "
                                       f"{k} is {d}, not {s}")
        shapes[name] = shape
    return shapes


def make_inputs(opened: Opened, specs: Sequence[str]) -> tuple[list[np.ndarray], list[str]]:
    """The arrays of the --input specs in the model's input order, checked by the model (dtype, rank, fixed
    dims); with one line per input saying where it came from."""
    arrays: dict[str, np.ndarray] = {}
    lines = []
    for spec in specs:
        name, value = _spec(spec, opened.declared, "--input", "FILE.npy, random or zeros")
        if name in arrays:
            raise CommandError(f"--input {spec!r}: input {name!r} is given twice")
        info = next(v for v in opened.declared if v.name == name)
        if value in ("random", "zeros"):
            shape, unset = opened.input_shape(name)
            arrays[name] = _generated(value, shape, info.dtype)
            note = f"; {', '.join(unset)} = 1: give --shape {name}=... for another size" if unset else ""
            lines.append(f"{_array(name, arrays[name])} ({value}{note})")
        else:
            arrays[name] = _load_npy(spec, value)
            lines.append(f"{_array(name, arrays[name])} ({value})")
    missing = [v.name for v in opened.declared if v.name not in arrays]
    if missing:
        raise CommandError(f"no --input for {', '.join(missing)}: give "
                           + " ".join(f"--input {n}=FILE.npy" for n in missing) + " (or NAME=random, NAME=zeros)")
    try:
        values = opened.model.arguments((), arrays)
    except (TypeError, ValueError) as err:
        raise CommandError(str(err)) from None
    return values, lines


def zero_inputs(opened: Opened) -> tuple[list[np.ndarray], list[str]]:
    """Zeros of every input's shape (--shape, else declared with symbolic dims at 1), and the notes on the
    symbolic dims set to 1."""
    values, notes = [], []
    for v in opened.declared:
        shape, unset = opened.input_shape(v.name)
        values.append(np.zeros(shape, v.dtype))
        if unset:
            notes.append(f"{v.name}: {', '.join(unset)} = 1 (give --shape {v.name}=... for another size)")
    return values, notes


def _generated(kind: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(shape, dtype)
    rng = np.random.default_rng(0)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 2, shape).astype(dtype)  # 0 and 1: a valid index into any table, a valid mask


def _load_npy(spec: str, path: str) -> np.ndarray:
    if not os.path.isfile(path):
        raise CommandError(f"--input {spec!r}: file {path!r} not found (expected a .npy file, random or zeros)")
    try:
        value = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise CommandError(f"--input {spec!r}: {path!r} is not a .npy file ({_first_line(err)})") from None
    if not isinstance(value, np.ndarray):  # an .npz archive
        value.close()
        raise CommandError(f"--input {spec!r}: {path!r} is an .npz archive; give one .npy file per input")
    return value


def _array(name: str, a: np.ndarray) -> str:
    return f"{name}: {a.dtype}[{', '.join(map(str, a.shape))}]"


def _size(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes} bytes" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    return ""


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms"


def _ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.3f} ms" if ms >= 1 else f"{ms:.4g} ms"


def serves(exe: Any, inputs: list) -> str:
    """The input shapes an executable serves: `data[1, 3, 224, 224]`, or symbolic dims with their guards."""
    from jitop.onnx.model import parameter_names
    shapes = {p.name: p.shape for p in exe.module.params if not p.is_output}
    parts = [f"{v.name}[{', '.join(map(str, shapes[p]))}]" if p in shapes else v.name
             for v, p in zip(inputs, parameter_names(inputs))]
    guards = list(exe.plan.guards)
    return ", ".join(parts) + (f" for {', '.join(guards)}" if guards else "")


def _header(opened: Opened) -> str:
    m = opened.model
    ins = ", ".join(v.describe() for v in opened.declared)
    outs = ", ".join(v.describe() for v in m.outputs)
    kind = "compiled jitop model" if opened.compiled else "ONNX model"
    where = f" on {m.target.arch}" if m.target is not None else ""
    return f"{opened.path}: {kind} {m.name!r}, {_size(opened.nbytes)}: ({ins}) -> ({outs}){where}"


# ---------------------------------------------------------------------------------------------
# jitop compile
# ---------------------------------------------------------------------------------------------

def compile_command(args: argparse.Namespace) -> int:
    """Load, compile for the shapes, write the .jitop file; print what was written."""
    start = time.perf_counter()
    opened = open_model(args.model, args.shape)
    if opened.compiled:
        raise CommandError(f"{args.model} is a compiled jitop model already; compile the .onnx model")
    out = args.output or os.path.splitext(args.model)[0] + ".jitop"
    if os.path.abspath(out) == os.path.abspath(args.model):
        raise CommandError(f"-o {out!r} would overwrite the model")
    print(_header(opened))
    zeros, notes = zero_inputs(opened)
    for note in notes:
        print(f"note: {note}")
    t0 = time.perf_counter()
    try:
        opened.model(*zeros)
    except Exception as err:  # noqa: BLE001 - compiling failed: one line, status 1
        raise CommandError(f"compiling {args.model} failed ({type(err).__name__}: {_first_line(err)})", 1) from None
    compile_s = time.perf_counter() - t0
    try:
        opened.model.save(out)
    except OSError as err:
        raise CommandError(f"cannot write {out!r} ({err.strerror or err})") from None
    total = time.perf_counter() - start
    exes = opened.model.executables()
    print(f"wrote {out}: {_size(os.path.getsize(out))} (code and weights) in {_seconds(total)} "
          f"(load {_seconds(opened.seconds)}, compile {_seconds(compile_s)}{_cache_answer(opened.model)})")
    for exe in exes:
        print(f"  serves {serves(exe, opened.declared)}: {len(exe.groups)} loop nest(s), "
              f"{len(exe.templates)} matmul/conv task(s)")
    print(f"load it with jitop.onnx.load({out!r}) (no onnx package needed), or: jitop run {out} --input ...")
    return 0


def _cache_answer(model: Any) -> str:
    """', disk cache hit' / ', disk cache miss ...' for the model's newest compiled signature ('' if unknown)."""
    if model.kernel is None:
        return ""
    for ov in reversed(model.kernel.dispatcher.overloads()):
        if ov.lookup is not None:
            return ", " + ov.lookup.describe().splitlines()[0].split(":")[0]
    return ""


# ---------------------------------------------------------------------------------------------
# jitop run
# ---------------------------------------------------------------------------------------------

def run_command(args: argparse.Namespace) -> int:
    """Run the model on the inputs; print the outputs, the first call's time and, with --repeat, the time per run."""
    if args.repeat < 0:
        raise CommandError(f"--repeat must be 0 or more, got {args.repeat}")
    opened = open_model(args.model, args.shape, args.target)
    values, lines = make_inputs(opened, args.input)
    model = opened.model
    print(_header(opened))
    for line in lines:
        print(f"input  {line}")
    t0 = time.perf_counter()
    try:
        results = model(*values)
    except (TypeError, ValueError) as err:
        if opened.compiled:  # not compiled for these shapes: a usage error with its advice
            raise CommandError(_first_line(err)) from None
        raise CommandError(f"running {args.model} failed ({type(err).__name__}: {_first_line(err)})", 1) from None
    except Exception as err:  # noqa: BLE001 - one line, status 1
        raise CommandError(f"running {args.model} failed ({type(err).__name__}: {_first_line(err)})", 1) from None
    first = time.perf_counter() - t0
    results = results if isinstance(results, tuple) else (results,)
    for info, value in zip(model.outputs, results):
        print(f"output {_array(info.name, value)}  {summary(value)}")
    what = ("links the compiled code" if opened.compiled else "traces and compiles the model"
            + _cache_answer(model).replace(",", ";", 1))
    print(f"loaded in {_seconds(opened.seconds)}; first call {_seconds(first)} ({what})")
    if args.repeat:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            model(*values)
            times.append(time.perf_counter() - t0)
        print(f"time per run: median {_ms(statistics.median(times))}, min {_ms(min(times))} "
              f"({args.repeat} runs)")
    if args.output:
        out = args.output if args.output.endswith(".npz") else args.output + ".npz"
        try:
            np.savez(out, **{info.name: value for info, value in zip(model.outputs, results)})
        except OSError as err:
            raise CommandError(f"cannot write {out!r} ({err.strerror or err})") from None
        print(f"wrote {out} ({', '.join(info.name for info in model.outputs)})")
    return 0


def summary(a: np.ndarray) -> str:
    """min, max, mean and the first values of an array (what a glance at an output needs)."""
    if a.size == 0:
        return "(empty)"
    flat = a.reshape(-1)
    head = np.array2string(flat[:6], precision=4, separator=", ", threshold=6)
    head = head[:-1] + ", ...]" if flat.size > 6 else head
    if a.dtype.kind == "b":
        return f"{int(flat.sum())} of {flat.size} true  {head}"
    if a.dtype.kind == "f":
        return f"min {flat.min():.4g}  max {flat.max():.4g}  mean {flat.mean(dtype=np.float64):.4g}  {head}"
    return f"min {flat.min()}  max {flat.max()}  {head}"


# ---------------------------------------------------------------------------------------------
# jitop tune MODEL
# ---------------------------------------------------------------------------------------------

def model_tasks(args: argparse.Namespace) -> tuple[list, str]:
    """The model's tuning tasks (jitop.tuner.WeightedTask: each distinct matmul/conv2d workload and how often a
    run uses it), heaviest first by flops, and a table of them for stderr."""
    from jitop.tuner.tuning import extract_tasks
    opened = open_model(args.model, args.shape)
    if opened.compiled:
        raise CommandError(f"{args.model} is a compiled jitop model (its configs are fixed); tune the .onnx model")
    zeros, notes = zero_inputs(opened)
    try:
        weighted = extract_tasks(opened.model.kernel, *zeros)
    except Exception as err:  # noqa: BLE001 - tracing failed: one line, status 1
        raise CommandError(f"tracing {args.model} failed ({type(err).__name__}: {_first_line(err)})", 1) from None
    if not weighted:
        raise CommandError(f"{args.model} runs no tunable operator (MatMul, Gemm, Conv)", status=1)
    weighted.sort(key=lambda w: -w.count * w.task.flops)
    at = ", ".join(_array(v.name, z) for v, z in zip(opened.declared, zeros))
    text = (f"{_header(opened)}\n" + "".join(f"note: {n}\n" for n in notes)
            + f"its tuning tasks at {at} (the tuner measures each task's default first and spends the budget "
              f"where the measured time is):\n" + task_table(weighted) + "\n")
    return weighted, text


def task_table(weighted: Sequence[Any]) -> str:
    """The tasks with their uses per run, MFLOP per run and share of the tasks' flops."""
    from jitop.tuner.report import describe_task
    total = sum(w.count * w.task.flops for w in weighted) or 1
    rows = [[describe_task(w.task), str(w.count), f"{w.count * w.task.flops / 1e6:.2f}",
             f"{100 * w.count * w.task.flops / total:.0f}%"] for w in weighted]
    return table(rows, ["task", "uses", "MFLOP", "share"])


# ---------------------------------------------------------------------------------------------
# jitop explain MODEL
# ---------------------------------------------------------------------------------------------

BLOCK_LINES = 12  # lines of a section of the kernel's explain text shown without --full


def explain_command(args: argparse.Namespace) -> int:
    """Operators, the fused kernel (jitop.kernel's explain text, abbreviated), the tuning tasks and their
    schedule sources, the median time against the peak, and the time per loop nest (a profiling build)."""
    if args.script_args:
        raise CommandError(f"arguments after -- ({' '.join(args.script_args)}) are a script's; "
                           f"{args.script} is a model")
    opened = open_model(args.script, args.shape)
    print(_header(opened))
    if opened.compiled:
        return _explain_compiled(opened)
    graph = opened.graph
    ops = Counter(n.op_type for n in graph.nodes)
    print(f"operators: {len(graph.nodes)} nodes, opset {graph.opset}: "
          + ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))))
    values, notes = zero_inputs(opened)
    for note in notes:
        print(f"note: {note}")
    print("explained at " + ", ".join(_array(v.name, z) for v, z in zip(opened.declared, values)) + "\n")
    kernel = opened.model.kernel
    text = io.StringIO()
    try:
        with contextlib.redirect_stdout(text):
            kernel.explain(*values)
    except Exception as err:  # noqa: BLE001 - compiling failed: one line, status 1
        raise CommandError(f"compiling {args.script} failed ({type(err).__name__}: {_first_line(err)})", 1) from None
    print(text.getvalue().rstrip() if args.full else abbreviate(text.getvalue()))
    from jitop.tuner.tuning import extract_tasks
    weighted = sorted(extract_tasks(kernel, *values), key=lambda w: -w.count * w.task.flops)
    if weighted:
        print(f"\ntuning tasks ({len(weighted)}; jitop tune {args.script} tunes them):")
        print(task_table(weighted))
    print()
    _time(opened, values, profile=not args.no_profile)
    return 0


def abbreviate(text: str) -> str:
    """The kernel's explain text without the traced graph and the loop IR (their sizes instead), each other
    section cut to BLOCK_LINES lines (a summary line at its end kept)."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        head = lines[0]
        if head.startswith("traced graph"):
            out.append(f"traced graph: {len(lines) - 1} nodes (--full shows them)")
        elif head.startswith("loop IR"):
            out.append(f"loop IR: {len(lines) - 1} lines (--full shows it)")
        elif head.startswith("target:"):
            continue  # the roofline below names the Target
        elif head.startswith("disk cache"):
            out.append(head + ("\n  (--full shows the key's parts)" if len(lines) > 1 else ""))
        elif len(lines) > BLOCK_LINES + 1:
            tail = [ln for ln in lines[-2:] if re.match(r"\s+\d+ of \d+ ", ln)]  # "2 of 9 untuned: ..."
            shown = lines[:BLOCK_LINES + 1 - len(tail)]
            out.append("\n".join([*shown, f"  ... {len(lines) - len(shown) - len(tail)} more (--full shows them)",
                                  *tail]))
        else:
            out.append(block)
    return "\n\n".join(out)


def _time(opened: Opened, values: list, profile: bool) -> None:
    """The median time of a call with % of peak and of memory bandwidth (jitop explain's figures), then the
    time per loop nest from a profiling build."""
    from jitop.cli.explain import _FirstCalls, _speed, roofline
    kernel = opened.model.kernel
    opened.model(*values)
    entries = [ov for ov in kernel.dispatcher.overloads() if ov.exe is not None and ov.exe.accepts(values)]
    if not entries:
        return
    entry = entries[0]
    first = _FirstCalls()
    first.record(kernel.dispatcher, entry, lambda: opened.model(*values))
    times = {id(entry): first.median_seconds(entry)}
    kernel.dispatcher.drain()  # explain's timing calls are not the program's: kept out of the workload log
    target, peak, bandwidth = roofline([entry], times)
    print(f"{opened.model.name}: {_speed(entry, times[id(entry)], peak, bandwidth, target)}")
    if profile:
        try:
            print("\n" + kernel.profile(*values, repeat=10).top(10))
        except Exception as err:  # noqa: BLE001 - the profile is a bonus
            print(f"\nprofile: not available ({type(err).__name__}: {_first_line(err)})")


def _explain_compiled(opened: Opened) -> int:
    """A .jitop file: the shapes each of its executables serves, and the time of a call (the file keeps the code,
    not the schedules it was built with)."""
    exes = opened.model.executables()
    for exe in exes:
        print(f"executable: serves {serves(exe, opened.declared)}")
    print("(the file keeps the compiled code, not its fusion groups and schedules: jitop explain the .onnx model "
          "for them)")
    values, notes = zero_inputs(opened)
    at = ", ".join(_array(v.name, z) for v, z in zip(opened.declared, values))
    if not any(exe.accepts(values) for exe in exes):
        print(f"\nnot timed: no executable serves {at} (give --shape NAME=D0,D1,... for a served shape)")
        return 0
    opened.model(*values)  # links the code
    times = []
    stop = time.perf_counter() + 0.3
    while len(times) < 5 or (len(times) < 100 and time.perf_counter() < stop):
        t0 = time.perf_counter()
        opened.model(*values)
        times.append(time.perf_counter() - t0)
    print(f"\n{opened.model.name}: time {_ms(statistics.median(times))} per call at {at} "
          f"(median of {len(times)} calls)")
    return 0
