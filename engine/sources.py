"""Model sources: every way a model can come in, turned into (model, inputs).

A spec is one string, the same in ``--model`` and in the dashboard:

- a built-in zoo name (``llama-tiny``, ``gpt2``, ... see engine/models.py);
- ``hf:NAME``: a Hugging Face transformers model built from a small config with random weights
  (``hf:llama``, ``hf:mistral``, ``hf:qwen2``, ``hf:gpt2``, ``hf:bert``; ``hf:llama-large`` at
  LLaMA-7B widths; ``hf:llama3-8b`` at LLaMA-3-8B's, two layers; ``hf:llama-1b``,
  ``hf:mistral-1b``, ``hf:qwen2-1b``, ``hf:gpt2-1b``, ``hf:bert-1b`` at ~1B-parameter widths, 4
  layers unless --n-layer says otherwise; ``hf:gpt2-small`` and ``hf:bert-base`` at the
  published models' widths and depths). Nothing is downloaded: the config is written here
  and the weights are random. Needs ``pip install transformers``;
- ``path/to/file.py:Name``: Name is an nn.Module class (constructed with the arguments of the
  file's ``get_init_inputs()`` if it has one, else none) or a zero-argument function returning a
  module. Inputs come from the file's ``get_inputs()``, or, with ``--input-shape``, are one random
  tensor of that shape in the run's dtype;
- ``path/to/file.py``: a KernelBench-style problem file: class ``Model``, ``get_inputs()``,
  ``get_init_inputs()``;
- ``op:FAMILY[:SHAPE][,FAMILY[:SHAPE]...]``: one call of each named family's operator at a shape
  in the family's own convention (``op:softmax:8192x8192``, ``op:matmul:4096x4096x4096``,
  ``op:attention:4x32x4096x128x8x1``), as models call it (torch.softmax, F.rms_norm's formula in
  an RMSNorm module, F.scaled_dot_product_attention, a gated MLP module...), so the profiler finds
  it like any model's op. It is how the loop optimizes an operator at a given shape, e.g. for
  ``python -m engine bench``. A family without a shape takes ``--input-shape`` (one family only)
  or its first benchmark shape (GPU) / a small sweep shape (CPU).

``validate`` checks a spec without running it (the file exists and parses, the name is defined
at its top level, the input shape is well formed); ``load`` builds the model and its inputs and
runs one forward pass, so a constructor that raises, inputs of the wrong shape for the model, or
a function that returns no module fail here with one clear SourceError, before a run exists.

Loading a file executes it: it is the user's own code, run in the user's process.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field

import torch
import torch.nn as nn

import kernels
from engine import models

# Small configs: hidden 64 keeps a forward pass to milliseconds on CPU and a kernel under the
# interpreter to seconds. "llama-large" has the built-in llama's widths (hidden 4096, FFN 14336,
# 32 heads, 8 KV heads), two layers: the GPU target.
HF_PRESETS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)),
    "llama-large": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096)),
    # LLaMA-3-8B's shape (hidden 4096, FFN 14336, 32 heads over 8 KV heads, a 128,256-token
    # vocabulary, RoPE base 500,000), two layers unless --n-layer says otherwise: the
    # end-to-end target against torch.compile, at 8x2048 by default (1x2048 with --input-shape)
    "llama3-8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
        rope_theta=500000.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=256)),
    "bert": ("BertConfig", "BertForMaskedLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=256, max_position_embeddings=256)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)),
    # ~1B-parameter widths (the GPU acceptance models; pick the depth with --n-layer): TinyLlama,
    # a Mistral of the same widths, Qwen2-1.5B, GPT-2 XL's width and BERT-large
    "llama-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)),
    "mistral-1b": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=4, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096, sliding_window=None)),
    "qwen2-1b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=4, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096)),
    "gpt2-1b": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=1600, n_layer=4, n_head=25, vocab_size=50257, n_positions=2048)),
    "bert-1b": ("BertConfig", "BertForMaskedLM", dict(
        hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
        vocab_size=30522, max_position_embeddings=512)),
    # the published small models at full depth, as transformers writes them (its default
    # attention, SDPA): GPT-2 small (124M) and BERT-base (110M), the end-to-end targets against
    # torch.compile at 8x1024 and 8x512
    "gpt2-small": ("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)),
    "bert-base": ("BertConfig", "BertForMaskedLM", dict(
        hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        vocab_size=30522, max_position_embeddings=512)),
}
HF_DEFAULT_SHAPE = {"llama-large": (1, 2048), "llama3-8b": (8, 2048), "llama-1b": (4, 2048),
                    "mistral-1b": (4, 2048), "qwen2-1b": (4, 2048), "gpt2-1b": (4, 2048),
                    "bert-1b": (8, 512), "gpt2-small": (8, 1024), "bert-base": (8, 512)}   # others: (2, 16)
# --n-layer and friends, named as the zoo names them, mapped to each config's own field.
_HF_ALIASES = {"n_layer": ("num_hidden_layers", "n_layer")}


class SourceError(ValueError):
    """A model spec that cannot be loaded; the message says what is wrong and what to do."""


@dataclass
class Source:
    spec: str
    kind: str                    # "zoo" | "hf" | "op" | "file"
    name: str                    # zoo or preset name, or the attribute in the file
    path: str | None = None      # the file, for kind "file"
    default_name: bool = False   # "file.py" without ":Name" (KernelBench: Model)


@dataclass
class Loaded:
    """A built model and what it takes: ``inputs`` for ``model(*inputs)``; ``new_inputs(seed)``
    makes fresh inputs of the same kind (other random values), for end-to-end checks."""
    model: nn.Module
    inputs: tuple
    source: Source
    dtype: torch.dtype
    device: torch.device
    _make: object = field(repr=False, default=None)

    def new_inputs(self, seed: int) -> tuple:
        return self._make(seed)

    def check_inputs(self, seed: int) -> list[tuple]:
        """Input sets for an end-to-end check: fresh inputs, and for the zoo's language models
        (ids, targets -> mean loss) the ids alone too, so the logits are compared and not only a
        scalar loss in which the kernels' differences can round away."""
        inputs = self.new_inputs(seed)
        if self.source.kind == "zoo" and len(inputs) == 2:
            return [inputs, inputs[:1]]
        return [inputs]


def parse(spec: str) -> Source:
    if not isinstance(spec, str) or not spec.strip():
        raise SourceError("empty model spec: give a built-in name, hf:NAME, op:FAMILY or "
                          "path/to/file.py[:Name]")
    spec = spec.strip()
    if spec in models.MODEL_NAMES:
        return Source(spec, "zoo", spec)
    if spec.startswith("op:"):
        op_calls(spec)            # raises SourceError on an unknown family or a bad shape
        return Source(spec, "op", spec[3:])
    if spec.startswith("hf:"):
        name = spec[3:]
        if name not in HF_PRESETS:
            raise SourceError(f"unknown model {spec!r}: Hugging Face presets are "
                              f"{', '.join('hf:' + n for n in HF_PRESETS)}")
        return Source(spec, "hf", name)
    path, name, default = spec, "Model", True
    m = re.match(r"^(.*\.py):([A-Za-z_][A-Za-z0-9_]*)$", spec)
    if m:
        path, name, default = m.group(1), m.group(2), False
    if not path.endswith(".py"):
        raise SourceError(f"unknown model {spec!r}: not a built-in model ({', '.join(models.MODEL_NAMES)}), "
                          f"an hf: preset ({', '.join('hf:' + n for n in HF_PRESETS)}), op:FAMILY[:SHAPE] "
                          f"or a path/to/file.py[:Name]")
    return Source(spec, "file", name, os.path.abspath(os.path.expanduser(path)), default)


def parse_dims(text) -> tuple[int, ...]:
    """'8x1024' or '4,8,64' -> (8, 1024) / (4, 8, 64): positive integers."""
    try:
        dims = tuple(int(x) for x in str(text).lower().replace(",", "x").split("x"))
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise SourceError(f"bad input shape {text!r}: expected positive integers like 8x1024 or 4x8x64")
    return dims


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def validate(spec: str, input_shape=None) -> Source:
    """Check ``spec`` (and ``input_shape``) without building anything. Raises SourceError."""
    src = parse(spec)
    if src.kind == "op":
        calls = op_calls(spec)
        if input_shape:
            parse_dims(input_shape)
            if len(calls) > 1 or calls[0][1] is not None:
                raise SourceError("--input-shape applies to op: with one family and no shape in "
                                  "the spec; write the shapes in it, e.g. op:softmax:8192x8192")
        return src
    if src.kind in ("zoo", "hf"):
        if src.kind == "hf" and importlib.util.find_spec("transformers") is None:
            raise SourceError(f"{spec} needs the transformers package: pip install transformers")
        if input_shape:
            try:
                models.parse_input_shape(input_shape)
            except ValueError as e:
                raise SourceError(str(e)) from None
        return src
    if input_shape:
        parse_dims(input_shape)
    if not os.path.isfile(src.path):
        raise SourceError(f"no such model file: {src.path}")
    # Parse, don't import: importing runs the user's code (and may import transformers, seconds).
    try:
        with open(src.path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=src.path)
    except (SyntaxError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot parse {src.path}: {type(e).__name__}: {e}") from None
    names = _top_level_names(tree)
    if src.name not in names:
        defined = sorted(n.name for n in tree.body if isinstance(n, ast.ClassDef))
        if src.default_name:
            raise SourceError(f"{src.path} has no class Model: a KernelBench problem file defines "
                              f"Model, get_inputs() and get_init_inputs(); name another module with "
                              f"{src.path}:Name (classes found: {', '.join(defined) or 'none'})")
        raise SourceError(f"{src.path} has no class or function named {src.name!r} "
                          f"(classes found: {', '.join(defined) or 'none'})")
    if not input_shape and "get_inputs" not in names:
        raise SourceError(f"{src.path} has no get_inputs(): pass --input-shape (e.g. 8x1024) "
                          f"for one random input tensor")
    return src


def default_dtype(spec: str, gpu: bool) -> str:
    """The dtype "auto" means: bfloat16 on a GPU for the zoo and hf: models (what LLMs run in),
    float32 for files (KernelBench problems and user modules are written in float32), and
    float32 under the interpreter."""
    if not gpu:
        return "float32"
    return "float32" if parse(spec).kind == "file" else "bfloat16"


def load(spec: str, dtype=torch.float32, device="cpu", input_shape=None, seed: int = 0,
         check: bool = True, **overrides) -> Loaded:
    """Build the model of ``spec`` in eval mode on device/dtype with seeded random weights, and
    its inputs; with ``check``, run one forward pass (no grad) so bad inputs fail here."""
    src = validate(spec, input_shape)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    device = torch.device(device)
    if src.kind == "op" and overrides:
        raise SourceError(f"model overrides ({', '.join(overrides)}) apply to built-in and hf: "
                          f"models only, not to {spec}")
    if src.kind == "zoo":
        loaded = _load_zoo(src, dtype, device, input_shape, seed, overrides)
    elif src.kind == "op":
        loaded = _load_op(src, dtype, device, input_shape, seed)
    elif src.kind == "hf":
        loaded = _load_hf(src, dtype, device, input_shape, seed, overrides)
    else:
        if overrides:
            raise SourceError(f"model overrides ({', '.join(overrides)}) apply to built-in and hf: "
                              f"models only, not to {src.path}")
        loaded = _load_file(src, dtype, device, input_shape, seed)
    if check:
        smoke(loaded.model, loaded.inputs, spec)
    return loaded


def smoke(model: nn.Module, inputs: tuple, spec: str = "the model") -> None:
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:
        shapes = ", ".join(_describe(t) for t in inputs)
        raise SourceError(f"{spec}: the forward pass failed on inputs ({shapes}): "
                          f"{type(e).__name__}: {_one_line(e)}") from None


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).removeprefix('torch.')}[{'x'.join(map(str, t.shape))}]"
    return type(t).__name__


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:400] + ("..." if len(text) > 400 else "")


# ---- built-in zoo -----------------------------------------------------------------------------

def _load_zoo(src, dtype, device, input_shape, seed, overrides) -> Loaded:
    try:
        model, inputs = models.build(src.name, dtype=dtype, device=device, input_shape=input_shape,
                                     seed=seed, **overrides)
    except ValueError as e:
        raise SourceError(str(e)) from None
    shape = tuple(inputs[0].shape)

    def make(s):
        return models.example_inputs(src.name, shape, seed=s, device=device, **overrides)
    return Loaded(model, tuple(inputs), src, dtype, device, make)


# ---- one operator at a shape ------------------------------------------------------------------

def op_calls(spec: str) -> list[tuple[str, tuple | None]]:
    """"op:softmax:8192x8192,matmul" -> [("softmax", (8192, 8192)), ("matmul", None)]."""
    body = spec.strip()[3:]
    calls = []
    for part in body.split(","):
        name, _, shape = part.strip().partition(":")
        if name not in kernels.FAMILY_NAMES:
            raise SourceError(f"unknown family {name!r} in {spec!r}; write op:FAMILY[:SHAPE] with "
                              f"a family of {', '.join(kernels.FAMILY_NAMES)}")
        if any(n == name for n, _ in calls):
            raise SourceError(f"{spec!r} names {name} twice: one shape per family")
        calls.append((name, _op_shape(name, shape) if shape else None))
    return calls


def _op_shape(family: str, text: str) -> tuple[int, ...]:
    # attention's sixth entry is its causal flag, 0 or 1 (kernels/attention.py); all else >= 1
    if family == "attention" and re.fullmatch(r"(\d+x){5}[01]", text.strip().lower()):
        head = parse_dims(text.strip().lower().rsplit("x", 1)[0])
        return head + (int(text.strip()[-1]),)
    return parse_dims(text)


class OpModel(nn.Module):
    """One call of each family's operator, in the family's shape convention, with the family's
    own inputs (kernels/<family>.py make_inputs): forward(*tensors) -> the outputs.

    Each call is the family's own reference (kernels/<family>.py ``reference``), which is one of
    its spellings: the model's graph is matched like any model's (engine/match.py), so nothing
    here names a family. The per-call constants (eps, causal, scale) are attributes; the tensors
    are forward's arguments, in the family's argument order."""

    def __init__(self, calls: list[dict]):
        super().__init__()
        self.calls = calls          # [{"family", "shape", "tensors": [names], "consts": {...}}]

    def forward(self, *tensors):
        outs, i = [], 0
        for c in self.calls:
            kw = dict(c["consts"])
            for n in c["tensors"]:
                kw[n], i = tensors[i], i + 1
            outs.append(kernels.get(c["family"]).reference(**kw))
        return outs[0] if len(outs) == 1 else tuple(outs)


def _load_op(src, dtype, device, input_shape, seed) -> Loaded:
    calls = []
    for name, shape in op_calls(src.spec):
        fam = kernels.get(name)
        if shape is None:
            shape = (parse_dims(input_shape) if input_shape else
                     tuple(fam.bench_shapes[0]) if device.type == "cuda" else tuple(fam.sweep_shapes[4]))
        if str(dtype).removeprefix("torch.") not in fam.dtypes:
            raise SourceError(f"op:{name} does not run in {dtype}; its dtypes: {', '.join(fam.dtypes)}")
        calls.append((fam, shape))

    def draw(s):
        gen = torch.Generator(device=device).manual_seed(s)
        out = []
        for fam, shape in calls:
            try:
                kw = fam.make_inputs(shape, dtype, device, gen)
            except Exception as e:
                raise SourceError(f"op:{fam.name}: shape {'x'.join(map(str, shape))} does not fit "
                                  f"its convention ({fam.signature}): {type(e).__name__}: "
                                  f"{_one_line(e)}") from None
            out.append(kw)
        return out

    first = draw(seed)
    specs = [{"family": fam.name, "shape": shape,
              "tensors": [n for n in fam.arg_names if isinstance(kw[n], torch.Tensor)],
              "consts": {n: kw[n] for n in fam.arg_names if not isinstance(kw[n], torch.Tensor)}}
             for (fam, shape), kw in zip(calls, first)]
    model = OpModel(specs).to(device).eval()

    def make(s):
        return tuple(kw[n] for c, kw in zip(specs, draw(s) if s != seed else first)
                     for n in c["tensors"])
    return Loaded(model, make(seed), src, dtype, device, make)


# ---- Hugging Face transformers ----------------------------------------------------------------

def _load_hf(src, dtype, device, input_shape, seed, overrides) -> Loaded:
    try:
        import transformers
    except ImportError:
        raise SourceError(f"{src.spec} needs the transformers package: pip install transformers") from None
    cfg_name, cls_name, base = HF_PRESETS[src.name]
    kw = dict(base)
    defaults = getattr(transformers, cfg_name)()
    for k, v in overrides.items():
        field_name = next((a for a in _HF_ALIASES.get(k, (k,)) if hasattr(defaults, a)), None)
        if field_name is None:
            raise SourceError(f"unknown config key {k!r} for {src.spec}")
        kw[field_name] = v
    # No KV cache in the outputs (a forward pass is what is profiled and compared); the eager
    # attention implementation would hide SDPA, so the default (SDPA) stays.
    kw["use_cache"] = False
    try:
        config = getattr(transformers, cfg_name)(**kw)
    except Exception as e:
        raise SourceError(f"{src.spec}: bad config: {type(e).__name__}: {_one_line(e)}") from None
    batch, seq = (models.parse_input_shape(input_shape) if isinstance(input_shape, str)
                  else tuple(input_shape) if input_shape else HF_DEFAULT_SHAPE.get(src.name, (2, 16)))
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and seq > limit:
        raise SourceError(f"sequence length {seq} exceeds {src.spec}'s {limit} positions")
    torch.manual_seed(seed)
    try:
        with device:
            model = getattr(transformers, cls_name)(config)
    except Exception as e:
        raise SourceError(f"{src.spec}: building {cls_name} failed: {type(e).__name__}: "
                          f"{_one_line(e)}") from None
    model = _cast(model, None, dtype).eval()
    vocab = config.vocab_size

    def make(s):
        gen = torch.Generator().manual_seed(s + 1)
        return (torch.randint(0, vocab, (batch, seq), generator=gen).to(device),)
    return Loaded(model, make(seed), src, dtype, device, make)


# ---- files --------------------------------------------------------------------------------------

def import_file(path: str):
    """Import ``path`` as a fresh module (its folder on sys.path while it imports, so it can
    import its neighbours). Raises SourceError with the file's own error."""
    digest = hashlib.sha256(path.encode()).hexdigest()[:10]
    name = f"nightshift_model_{re.sub(r'[^A-Za-z0-9_]', '_', os.path.basename(path)[:-3])}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise SourceError(f"importing {path} failed: {type(e).__name__}: {_one_line(e)}") from None
    finally:
        if sys.path and sys.path[0] == folder:
            sys.path.pop(0)
    return module


def _call_with(fn, args, what: str):
    try:
        if isinstance(args, dict):
            return fn(**args)
        return fn(*args)
    except Exception as e:
        raise SourceError(f"{what} failed: {type(e).__name__}: {_one_line(e)}") from None


def _as_tuple(value, what: str) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise SourceError(f"{what} must return a list of inputs, got {type(value).__name__}")


def _load_file(src, dtype, device, input_shape, seed) -> Loaded:
    module = import_file(src.path)
    where = os.path.basename(src.path)
    obj = getattr(module, src.name, None)
    if obj is None:
        raise SourceError(f"{src.path} has no class or function named {src.name!r}")
    init = ()
    if hasattr(module, "get_init_inputs"):
        init = _call_with(module.get_init_inputs, (), f"{where}: get_init_inputs()")
        if not isinstance(init, (list, tuple, dict)):
            raise SourceError(f"{where}: get_init_inputs() must return a list (or dict) of "
                              f"constructor arguments, got {type(init).__name__}")
    torch.manual_seed(seed)
    if isinstance(obj, type):
        if not issubclass(obj, nn.Module):
            raise SourceError(f"{src.name} in {where} is a class but not an nn.Module subclass")
        with device:
            model = _call_with(obj, init, f"constructing {src.name} from {where}")
    elif callable(obj):
        with device:
            model = _call_with(obj, (), f"calling {src.name}() from {where}")
        if not isinstance(model, nn.Module):
            raise SourceError(f"{src.name}() in {where} returned {type(model).__name__}, not an nn.Module")
    else:
        raise SourceError(f"{src.name} in {where} is a {type(obj).__name__}, not an nn.Module class "
                          f"or a function returning one")
    model = _cast(model, device, dtype).eval()
    get_inputs = getattr(module, "get_inputs", None)
    shape = parse_dims(input_shape) if input_shape else None

    def draw():
        if shape is not None:
            return (torch.randn(shape),)
        return _as_tuple(_call_with(get_inputs, (), f"{where}: get_inputs()"), f"{where}: get_inputs()")

    def make(s):
        return tuple(_place(t, dtype, device) for t in draw_on(draw, s, device))
    return Loaded(model, make(seed), src, dtype, device, make)


def draw_on(draw, seed: int, device) -> tuple:
    """``draw()`` (a problem's get_inputs) seeded with ``seed``, its tensors made on ``device``:
    KernelBench's get_inputs() builds them on the CPU from the global generator, and one
    [128, 4096, 4095] fp32 input took 28 s to draw on 2 CPU cores; a problem's scoring draws
    up to eight sets (the run, the end-to-end check, five trials, the timing). Factory calls
    without a device follow the default device; a get_inputs that cannot run there (one that
    goes through numpy) is drawn on the CPU. The generators are seeded, then put back."""
    device = torch.device(device)
    if device.type != "cpu":
        idx = [device.index if device.index is not None else torch.cuda.current_device()] \
            if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=idx), device:
                torch.manual_seed(seed + 1)
                return draw()
        except SourceError:
            pass                                   # on the CPU, as the problem wrote it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        return draw()


def _place(t, dtype, device):
    """Floating tensors to the run's dtype and device; integer tensors to the device only."""
    if isinstance(t, torch.Tensor):
        return t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
    return t


def describe_inputs(inputs) -> str:
    return ", ".join(_describe(t) for t in inputs)


def _cast(model: nn.Module, device, dtype) -> nn.Module:
    """model.to(device, dtype) for its floating-point parameters and buffers alone: Module.to
    would cast a complex buffer (RoPE's freqs_cis, as torchtitan registers it) to the real
    dtype too, dropping its imaginary parts."""
    return model._apply(lambda t: t.to(device=device, dtype=dtype) if t.is_floating_point()
                        else t.to(device=device))
