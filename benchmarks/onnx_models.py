"""The ONNX models of bench_onnx.py, built here in plain torch and exported with torch.onnx.export.

No torchvision (nor any download): the architectures are re-written below with torch.nn, random weights from a
fixed seed, eval mode.

- resnet18, resnet50: torchvision's ResNet (BasicBlock [2, 2, 2, 2]; Bottleneck v1.5 [3, 4, 6, 3], the stride on
  the 3x3 conv), input "data" (batch, 3, 224, 224) float32, output "logits" (batch, 1000);
- mobilenet_v2: torchvision's MobileNetV2 (width 1.0: inverted residuals, ReLU6, depthwise 3x3 convs), same
  input and output;
- bert_base_encoder: a BERT-base encoder (12 layers, hidden 768, 12 heads, FFN 3072, exact erf GELU, post-norm
  LayerNorm eps 1e-12; word + position + token-type embeddings, vocabulary 30522), input "input_ids"
  (batch, 128) int64, output "last_hidden_state" (batch, 128, 768) float32. `attention_mask=True` adds a
  second input "attention_mask" (batch, 128) int64 (1: attend, 0: padding), BERT's additive -10000 mask.

Weights: convolutions He-normal (fan_out, as torchvision), batch norms with random scale/shift and running
statistics (so the folded convolutions are not the identity's), linears N(0, 0.02) as BERT (the classifiers
N(0, 0.01)); the residual branches' last batch norm has a smaller scale so activations stay O(1) to the logits.

Export: torch.onnx.export with the TorchScript exporter (dynamo=False), opset 17, constant folding on, the
weights as initializers. Each builder takes `folder`, `batch` and `dynamic`:
- dynamic=True (default): the batch dimension is the symbol "batch" (dynamic_axes); traced at batch 2 so no
  size-1 case is baked in; file NAME.onnx (`batch` only sizes `sample_inputs`);
- dynamic=False: every dimension fixed, traced at `batch`; file NAME_b{batch}.onnx.
A file is exported once: a sidecar NAME[_bB].onnx.json holds the builder's version stamp (and the op counts),
and a file whose stamp matches is reused.

    python benchmarks/onnx_models.py FOLDER [--models resnet18 ...] [--fixed B] [--force]

exports the models (dynamic batch; with --fixed B also the fixed-shape files) and prints each file's op types
with their counts.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import time
import warnings
from typing import Any, Callable

import numpy as np

OPSET = 17
SEED = 2024
IMAGE = (3, 224, 224)
SEQ = 128
VOCAB = 30522
DYNAMIC_TRACE_BATCH = 2

# bump a model's number when its builder changes: its cached files are then exported again
VERSIONS = {"resnet18": 1, "resnet50": 1, "mobilenet_v2": 1, "bert_base_encoder": 1}


# ** the architectures (torch is imported lazily: importing this module needs only numpy) **

def _nn() -> Any:
    import torch
    return torch


def _init_bn(bn: Any, gen: Any, scale: tuple[float, float] = (0.5, 1.0)) -> None:
    torch = _nn()
    c = bn.num_features
    with torch.no_grad():
        bn.weight.copy_(torch.empty(c).uniform_(*scale, generator=gen))
        bn.bias.copy_(torch.empty(c).normal_(0.0, 0.1, generator=gen))
        bn.running_mean.copy_(torch.empty(c).normal_(0.0, 0.1, generator=gen))
        bn.running_var.copy_(torch.empty(c).uniform_(0.5, 1.5, generator=gen))


def _init_cnn(model: Any, gen: Any, last_bn: Callable[[Any], bool] = lambda m: False) -> None:
    """torchvision's init (He-normal fan_out convs, N(0, 0.01) fc), random batch norm statistics."""
    torch = _nn()
    nn = torch.nn
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups
                m.weight.normal_(0.0, (2.0 / fan_out) ** 0.5, generator=gen)
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                _init_bn(m, gen, (0.1, 0.3) if last_bn(m) else (0.5, 1.0))
            elif isinstance(m, nn.Linear):
                m.weight.normal_(0.0, 0.01, generator=gen)
                m.bias.normal_(0.0, 0.01, generator=gen)


def _resnet(layers: tuple[int, ...], bottleneck: bool) -> Any:
    torch = _nn()
    nn = torch.nn

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.bn2.last = True
            self.downsample = downsample

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # v1.5: the stride here
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.bn3.last = True
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + identity)

    block = Bottleneck if bottleneck else BasicBlock

    class ResNet(nn.Module):
        def __init__(self, num_classes: int = 1000) -> None:
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._make_layer(64, layers[0])
            self.layer2 = self._make_layer(128, layers[1], 2)
            self.layer3 = self._make_layer(256, layers[2], 2)
            self.layer4 = self._make_layer(512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * block.expansion, num_classes)

        def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> Any:
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                           nn.BatchNorm2d(planes * block.expansion))
            mods = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            mods += [block(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*mods)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = torch.flatten(self.avgpool(x), 1)
            return self.fc(x)

    return ResNet()


def _mobilenet_v2(num_classes: int = 1000) -> Any:
    torch = _nn()
    nn = torch.nn

    def conv_bn_relu6(inp: int, oup: int, kernel: int = 3, stride: int = 1, groups: int = 1) -> Any:
        return nn.Sequential(nn.Conv2d(inp, oup, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(oup), nn.ReLU6(inplace=True))

    class InvertedResidual(nn.Module):
        def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int) -> None:
            super().__init__()
            hidden = int(round(inp * expand_ratio))
            self.use_res_connect = stride == 1 and inp == oup
            layers = [conv_bn_relu6(inp, hidden, 1)] if expand_ratio != 1 else []
            layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
                       nn.Conv2d(hidden, oup, 1, bias=False), nn.BatchNorm2d(oup)]
            layers[-1].last = self.use_res_connect
            self.conv = nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                        (6, 320, 1, 1)]  # t (expansion), c (channels), n (repeats), s (first stride)
            inp = 32
            feats = [conv_bn_relu6(3, inp, stride=2)]
            for t, c, n, s in settings:
                for i in range(n):
                    feats.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                    inp = c
            feats.append(conv_bn_relu6(inp, 1280, 1))
            self.features = nn.Sequential(*feats)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x: Any) -> Any:
            x = self.features(x)
            x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, (1, 1)), 1)
            return self.classifier(x)

    return MobileNetV2()


def _bert(layers: int = 12, hidden: int = 768, heads: int = 12, ffn: int = 3072, vocab: int = VOCAB,
          max_pos: int = 512, type_vocab: int = 2, eps: float = 1e-12, attention_mask: bool = False) -> Any:
    torch = _nn()
    nn = torch.nn
    head_dim = hidden // heads

    class SelfAttention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
            self.scale = float(head_dim) ** 0.5

        def heads(self, x: Any) -> Any:  # (b, s, hidden) -> (b, heads, s, head_dim), as HF BERT writes it
            return x.view(x.size()[:-1] + (heads, head_dim)).permute(0, 2, 1, 3)

        def forward(self, x: Any, mask: Any) -> Any:
            q, k, v = self.heads(self.query(x)), self.heads(self.key(x)), self.heads(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / self.scale
            if mask is not None:
                scores = scores + mask
            probs = torch.softmax(scores, dim=-1)
            ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
            return ctx.view(ctx.size()[:-2] + (hidden,))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = SelfAttention()
            self.attn_out = nn.Linear(hidden, hidden)
            self.attn_norm = nn.LayerNorm(hidden, eps=eps)
            self.intermediate = nn.Linear(hidden, ffn)
            self.gelu = nn.GELU()  # exact (erf)
            self.output = nn.Linear(ffn, hidden)
            self.out_norm = nn.LayerNorm(hidden, eps=eps)

        def forward(self, x: Any, mask: Any) -> Any:
            x = self.attn_norm(x + self.attn_out(self.attention(x, mask)))
            return self.out_norm(x + self.output(self.gelu(self.intermediate(x))))

    class BertEncoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(vocab, hidden)
            self.position = nn.Embedding(max_pos, hidden)
            self.token_type = nn.Embedding(type_vocab, hidden)
            self.norm = nn.LayerNorm(hidden, eps=eps)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)

        def forward(self, input_ids: Any, *mask_arg: Any) -> Any:
            seq = input_ids.size(1)
            pos = self.position_ids[:, :seq]
            types = torch.zeros_like(input_ids)
            x = self.norm(self.word(input_ids) + self.token_type(types) + self.position(pos))
            mask = None
            if attention_mask:
                mask = (1.0 - mask_arg[0][:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    return BertEncoder()


def _init_bert(model: Any, gen: Any) -> None:
    torch = _nn()
    nn = torch.nn
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                m.weight.normal_(0.0, 0.02, generator=gen)
                if isinstance(m, nn.Linear):
                    m.bias.normal_(0.0, 0.02, generator=gen)
            elif isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.8, 1.2, generator=gen)
                m.bias.normal_(0.0, 0.05, generator=gen)


# ** the registry **

class Spec:
    """A model: how to build its torch module, its inputs and outputs."""

    def __init__(self, name: str, build: Callable[..., Any], inputs: Callable[[int, dict], dict[str, tuple]],
                 outputs: list[str]) -> None:
        self.name, self._build, self._inputs, self.outputs = name, build, inputs, outputs

    def module(self, **options: Any) -> Any:
        """The torch module in eval mode, weights from the fixed seed (the same on every call)."""
        torch = _nn()
        gen = torch.Generator().manual_seed(SEED + VERSIONS[self.name])
        with torch.random.fork_rng(devices=[]):  # the module's own default init must not depend on the caller's RNG
            torch.manual_seed(SEED)
            m = self._build(gen, **options)
        return m.eval()

    def inputs(self, batch: int, **options: Any) -> dict[str, tuple[tuple[int, ...], str]]:
        """{input name: (shape, dtype name)} at `batch`."""
        return self._inputs(batch, options)


def _cnn_inputs(batch: int, options: dict) -> dict[str, tuple]:
    return {"data": ((batch, *IMAGE), "float32")}


def _bert_inputs(batch: int, options: dict) -> dict[str, tuple]:
    found = {"input_ids": ((batch, SEQ), "int64")}
    if options.get("attention_mask"):
        found["attention_mask"] = ((batch, SEQ), "int64")
    return found


def _build_resnet(layers: tuple[int, ...], bottleneck: bool) -> Callable[..., Any]:
    def build(gen: Any) -> Any:
        m = _resnet(layers, bottleneck)
        _init_cnn(m, gen, last_bn=lambda bn: getattr(bn, "last", False))
        return m
    return build


def _build_mobilenet(gen: Any) -> Any:
    m = _mobilenet_v2()
    _init_cnn(m, gen, last_bn=lambda bn: getattr(bn, "last", False))
    return m


def _build_bert(gen: Any, attention_mask: bool = False) -> Any:
    m = _bert(attention_mask=attention_mask)
    _init_bert(m, gen)
    return m


MODELS: dict[str, Spec] = {
    "resnet18": Spec("resnet18", _build_resnet((2, 2, 2, 2), False), _cnn_inputs, ["logits"]),
    "resnet50": Spec("resnet50", _build_resnet((3, 4, 6, 3), True), _cnn_inputs, ["logits"]),
    "mobilenet_v2": Spec("mobilenet_v2", _build_mobilenet, _cnn_inputs, ["logits"]),
    "bert_base_encoder": Spec("bert_base_encoder", _build_bert, _bert_inputs, ["last_hidden_state"]),
}


def sample_inputs(name: str, batch: int, seed: int = 0, **options: Any) -> dict[str, np.ndarray]:
    """Inputs of `name` at `batch` from a fixed seed: images N(0, 1) float32; token ids uniform in the vocabulary
    (the attention mask: ones, the last quarter of the second half of the rows zero)."""
    rng = np.random.default_rng(seed)
    found = {}
    for key, (shape, dtype) in MODELS[name].inputs(batch, **options).items():
        if key == "input_ids":
            found[key] = rng.integers(0, VOCAB, size=shape, dtype=np.int64)
        elif key == "attention_mask":
            mask = np.ones(shape, np.int64)
            mask[shape[0] // 2:, -shape[1] // 4:] = 0
            found[key] = mask
        else:
            found[key] = rng.standard_normal(shape).astype(dtype)
    return found


def torch_module(name: str, **options: Any) -> Any:
    """The model as a torch module (eval mode), the weights the exported file has."""
    return MODELS[name].module(**options)


def flops(name: str, batch: int, **options: Any) -> float:
    """Multiply-add flops (2 per MAC) of one run at `batch`: convolutions and linears (counted by forward hooks on
    a run of the torch module), plus BERT's two attention matmuls per layer."""
    torch = _nn()
    nn = torch.nn
    model = torch_module(name, **options)
    total = [0.0]

    def hook(m: Any, args: Any, out: Any) -> None:
        if isinstance(m, nn.Conv2d):
            total[0] += 2.0 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        else:
            total[0] += 2.0 * out.numel() * m.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    # the hooks only need shapes: a batch-1 run, scaled (every counted op is linear in the batch)
    feed = {k: torch.from_numpy(v) for k, v in sample_inputs(name, 1, **options).items()}
    with torch.no_grad():
        model(*feed.values())
    for h in handles:
        h.remove()
    if name.startswith("bert"):
        layers = len(model.layers)
        total[0] += layers * 2 * (2.0 * SEQ * SEQ * 768)  # q @ k^T and probs @ v over all heads
    return total[0] * batch


# ** export **

def file_name(name: str, batch: int, dynamic: bool, **options: Any) -> str:
    extra = "".join(f"_{k}" for k, v in sorted(options.items()) if v)
    return f"{name}{extra}.onnx" if dynamic else f"{name}{extra}_b{batch}.onnx"


def stamp(name: str, batch: int, dynamic: bool, **options: Any) -> dict[str, Any]:
    """What a cached file must have been exported with to be reused."""
    return {"model": name, "version": VERSIONS[name], "opset": OPSET, "dynamic": dynamic,
            "batch": None if dynamic else batch, "options": {k: v for k, v in sorted(options.items()) if v}}


def export(name: str, folder: str | os.PathLike, batch: int = 1, dynamic: bool = True, force: bool = False,
           **options: Any) -> str:
    """Export model `name` to `folder` and return the .onnx path (reused when its stamp matches, see the module
    docstring). dynamic=True: the batch dimension is the symbol "batch"; False: fixed at `batch`."""
    import torch
    spec = MODELS[name]
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(name, batch, dynamic, **options)
    side = path.with_name(path.name + ".json")
    want = stamp(name, batch, dynamic, **options)
    if not force and path.exists() and side.exists():
        try:
            have = json.loads(side.read_text())
            if {k: have.get(k) for k in want} == want:
                return str(path)
        except (OSError, ValueError):
            pass
    model = spec.module(**options)
    trace_batch = DYNAMIC_TRACE_BATCH if dynamic else batch
    feed = {k: torch.from_numpy(v) for k, v in sample_inputs(name, trace_batch, **options).items()}
    names = list(feed)
    dynamic_axes = None
    if dynamic:
        dynamic_axes = {k: {0: "batch"} for k in names + spec.outputs}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    t0 = time.perf_counter()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(model, tuple(feed.values()), str(tmp), dynamo=False, opset_version=OPSET,
                          do_constant_folding=True, input_names=names, output_names=spec.outputs,
                          dynamic_axes=dynamic_axes, export_params=True)
    seconds = time.perf_counter() - t0
    os.replace(tmp, path)
    ops = op_counts(str(path))
    side.write_text(json.dumps({**want, "torch": torch.__version__, "export_seconds": round(seconds, 2),
                                "op_counts": ops}, indent=1) + "\n")
    return str(path)


def resnet18(folder: str | os.PathLike, batch: int = 1, dynamic: bool = True, **kw: Any) -> str:
    return export("resnet18", folder, batch, dynamic, **kw)


def resnet50(folder: str | os.PathLike, batch: int = 1, dynamic: bool = True, **kw: Any) -> str:
    return export("resnet50", folder, batch, dynamic, **kw)


def mobilenet_v2(folder: str | os.PathLike, batch: int = 1, dynamic: bool = True, **kw: Any) -> str:
    return export("mobilenet_v2", folder, batch, dynamic, **kw)


def bert_base_encoder(folder: str | os.PathLike, batch: int = 1, dynamic: bool = True,
                      attention_mask: bool = False, **kw: Any) -> str:
    return export("bert_base_encoder", folder, batch, dynamic, attention_mask=attention_mask, **kw)


# ** what is in a file **

def op_counts(path: str) -> dict[str, int]:
    """{op type (domain-qualified when not the default domain): count} of the graph's nodes (subgraphs included),
    most frequent first."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    counts: collections.Counter[str] = collections.Counter()

    def walk(graph: Any) -> None:
        for node in graph.node:
            counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
            for attr in node.attribute:
                if attr.g is not None and attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return dict(counts.most_common())


def describe(path: str) -> str:
    """Opset, inputs/outputs with their shapes, initializer count and size, op types with counts."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)

    def shape(v: Any) -> str:
        dims = [d.dim_param or str(d.dim_value) for d in v.type.tensor_type.shape.dim]
        return f"{v.name} ({', '.join(dims)}) {onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type)}"

    n_init = len(model.graph.initializer)
    size = sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer) / 2 ** 20
    ops = op_counts(path)
    return (f"{os.path.basename(path)}: opset {opsets}; inputs {', '.join(shape(v) for v in model.graph.input)}; "
            f"outputs {', '.join(shape(v) for v in model.graph.output)}; {len(model.graph.node)} nodes, "
            f"{n_init} initializers (~{size:.0f} MiB); ops: "
            + ", ".join(f"{k} {v}" for k, v in ops.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--fixed", type=int, nargs="*", default=[], metavar="B",
                   help="also export fixed-shape files at these batch sizes")
    p.add_argument("--attention-mask", action="store_true", help="BERT with the attention_mask input too")
    p.add_argument("--force", action="store_true", help="export again even when the stamp matches")
    args = p.parse_args()
    import torch
    print(f"torch {torch.__version__}, opset {OPSET}, TorchScript exporter (dynamo=False), constant folding on")
    for name in args.models:
        options = {"attention_mask": True} if args.attention_mask and name.startswith("bert") else {}
        for dynamic, batch in [(True, 1)] + [(False, b) for b in args.fixed]:
            side = pathlib.Path(args.folder) / (file_name(name, batch, dynamic, **options) + ".json")
            before = side.stat().st_mtime_ns if side.exists() else None
            path = export(name, args.folder, batch, dynamic, force=args.force, **options)
            info = json.loads(side.read_text())
            fresh = before is None or side.stat().st_mtime_ns != before
            when = "exported now" if fresh else "cached, exported earlier"
            print(f"\n{describe(path)}\n  (export {info.get('export_seconds', '?')} s, {when})", flush=True)


if __name__ == "__main__":
    main()
