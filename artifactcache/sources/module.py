"""Any ``nn.Module`` as a model source: its inputs, its fingerprint, a CLI spec.

A :class:`ModuleSpec` is what the module backends (``backends/<folder>/module.py``)
build from and what api/module.py keys. Its key factors are computed without tracing,
so a warm process never runs ``torch.export`` just to find its entry:

* the source of every class in the module tree (each class in ``model.modules()``
  and its bases up to ``nn.Module``), hashed; classes from torch itself are named
  only, since the toolchain factor holds torch's version; a class whose source
  cannot be read is named with a note;
* every parameter and buffer: name, shape, dtype;
* the example inputs' shapes and dtypes, and the dynamic dimensions;
* the user's ``name``/``version``, the one way to cover what the fingerprint cannot
  see (a helper function outside any module class, a config read at run time);
* where the artifact holds the weights, a digest of the tensors' bytes.

The CLI spec is ``pkg.module:factory`` or ``path/to/file.py:factory``: the factory
takes no arguments and returns a module or a ``(module, example_inputs)`` pair.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..dtypes import DTYPE_NAMES, input_dtype_name, torch_dtype, torch_input_dtype
from ..dtypes import INPUT_DTYPES as INPUT_DTYPE_TABLE
from ..errors import ModelSpecError, ShapeError

if TYPE_CHECKING:
    import torch

# The dtypes an input may have, by the name the CLI spells.
INPUT_DTYPES = tuple(INPUT_DTYPE_TABLE)
FLOAT_DTYPES = DTYPE_NAMES
_SHAPE = re.compile(r"^\d+(x\d+)*$")
# Classes from these packages are covered by the toolchain factor (their version).
_VERSIONED_PACKAGES = ("torch",)


def dtype_name(dtype: torch.dtype) -> str:
    name = input_dtype_name(dtype)
    if name is None:
        raise ModelSpecError(f"inputs of dtype {dtype} are not supported: use {INPUT_DTYPES}")
    return name


@dataclass(frozen=True)
class InputSpec:
    """One positional input: its shape, dtype and, for integer inputs, the value bound."""

    shape: tuple[int, ...]
    dtype: str = "fp32"
    high: int | None = None  # integer inputs are drawn from [0, high); zeros when None

    def factors(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    def describe(self) -> str:
        return "x".join(map(str, self.shape)) + f":{self.dtype}"

    def make(self, device: str, generator: torch.Generator | None = None) -> torch.Tensor:
        import torch

        dt = torch_input_dtype(self.dtype)
        if self.dtype in FLOAT_DTYPES:
            return torch.randn(self.shape, generator=generator).to(device=device, dtype=dt)
        if self.high is None or self.dtype == "bool":
            return torch.zeros(self.shape, dtype=dt, device=device)
        return torch.randint(0, self.high, self.shape, generator=generator).to(device, dt)


def parse_input(text: str, model_dtype: str = "fp32") -> InputSpec:
    """``1x3x224x224[:fp16]`` or ``1x128:int64[:30522]`` (integers drawn below the bound).

    A float input without a dtype takes the model's; one with another float dtype
    is refused, since float inputs are cast to the model's dtype.
    """
    parts = text.strip().split(":")
    if not parts[0] or not _SHAPE.match(parts[0]) or len(parts) > 3:
        raise ModelSpecError(
            f"--input {text!r}: expected SHAPE[:DTYPE[:HIGH]], e.g. 1x3x224x224:fp16 "
            "or 1x128:int64:30522"
        )
    shape = tuple(int(d) for d in parts[0].split("x"))
    dtype = parts[1] if len(parts) > 1 and parts[1] else model_dtype
    if dtype not in INPUT_DTYPES:
        raise ModelSpecError(f"--input {text!r}: dtype must be one of {', '.join(INPUT_DTYPES)}")
    if dtype in FLOAT_DTYPES and dtype != model_dtype:
        raise ModelSpecError(
            f"--input {text!r}: float inputs run in the model's dtype ({model_dtype}); "
            f"pass --dtype {dtype} or leave the input's dtype out"
        )
    high = None
    if len(parts) == 3:
        if dtype in FLOAT_DTYPES or dtype == "bool" or not parts[2].isdigit() or int(parts[2]) < 1:
            raise ModelSpecError(f"--input {text!r}: HIGH is a positive bound for integer inputs")
        high = int(parts[2])
    if any(d == 0 for d in shape):
        raise ModelSpecError(f"--input {text!r}: every dimension must be at least 1")
    return InputSpec(shape, dtype, high)


def with_batch(specs: Sequence[InputSpec], batch: int) -> tuple[InputSpec, ...]:
    """The same inputs with dimension 0 set to ``batch`` (bench's batch sizes)."""
    return tuple(InputSpec((batch, *s.shape[1:]), s.dtype, s.high) for s in specs)


@dataclass
class ModuleSpec:
    """A user module with the inputs it is compiled for."""

    module: torch.nn.Module
    inputs: tuple[InputSpec, ...]
    example_inputs: tuple[torch.Tensor, ...]
    # Per input: {dim: (min, max)} for the dimensions that may vary; () when all static.
    dynamic: tuple[dict[int, tuple[int, int]], ...] = ()
    name: str | None = None
    version: str | None = None
    origin: str = "python"  # "python" or the CLI spec it came from
    device: str = "cpu"
    dtype: str = "fp32"
    _fingerprint: dict[str, Any] | None = field(default=None, repr=False)

    def label(self) -> str:
        if self.name:
            return self.name
        return self.origin if self.origin != "python" else type(self.module).__name__

    def dynamic_factors(self) -> list[Any]:
        return [
            {str(d): [lo, hi] for d, (lo, hi) in sorted(dims.items())} if dims else None
            for dims in self.dynamic
        ]

    def fingerprint(self) -> dict[str, Any]:
        """The module's key factors (computed once: the classes' sources are read from disk)."""
        if self._fingerprint is None:
            classes, notes = class_sources(self.module)
            self._fingerprint = {
                "kind": "module",
                "name": self.name,
                "version": self.version,
                "classes": classes,
                "notes": notes,
                "state": state_summary(self.module),
                "training": bool(self.module.training),
                "inputs": [s.factors() for s in self.inputs],
                "dynamic_shapes": self.dynamic_factors(),
            }
        return self._fingerprint

    def check_call(self, args: Sequence[Any]) -> None:
        """ShapeError unless args fit the inputs the artifact was built for."""
        import torch

        if len(args) != len(self.inputs):
            raise ShapeError(
                f"the model was compiled for {len(self.inputs)} inputs, got {len(args)}"
            )
        dyn = self.dynamic or tuple({} for _ in self.inputs)
        for i, (a, s, dims) in enumerate(zip(args, self.inputs, dyn, strict=True)):
            if not isinstance(a, torch.Tensor):
                raise ShapeError(f"input {i} is a {type(a).__name__}, not a tensor")
            if dtype_name(a.dtype) != s.dtype or a.dim() != len(s.shape):
                raise ShapeError(
                    f"input {i} is {_describe(a)}, the artifact was built for {s.describe()}"
                )
            for d, (size, want) in enumerate(zip(a.shape, s.shape, strict=True)):
                lo, hi = dims.get(d, (want, want))
                if not lo <= size <= hi:
                    raise ShapeError(
                        f"input {i} is {_describe(a)}, the artifact was built for "
                        f"{s.describe()} (dimension {d} in {lo}..{hi})"
                    )


def _describe(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) + f":{dtype_name(t.dtype)}"


def class_sources(module: torch.nn.Module) -> tuple[dict[str, str], list[str]]:
    """{qualified class name: source digest | "torch" | "unreadable"}, and notes."""
    from torch import nn

    out: dict[str, str] = {}
    notes: list[str] = []
    for m in module.modules():
        for cls in type(m).__mro__:
            if cls is nn.Module or cls is object:
                break
            qual = f"{cls.__module__}.{cls.__qualname__}"
            if qual in out:
                continue
            if cls.__module__.split(".")[0] in _VERSIONED_PACKAGES:
                out[qual] = "torch"  # toolchain.torch covers it
                continue
            try:
                src = inspect.getsource(cls)
            except (OSError, TypeError):
                out[qual] = "unreadable"
                notes.append(f"{qual}: source not readable, only its name is in the key")
                continue
            out[qual] = "sha256:" + hashlib.sha256(src.encode()).hexdigest()
    return out, notes


def state_spec(module: torch.nn.Module) -> list[list[Any]]:
    """[name, shape, dtype] of every parameter and buffer (tied ones under each name)."""
    rows = []
    named = list(module.named_parameters(remove_duplicate=False))
    named += list(module.named_buffers(remove_duplicate=False))
    for name, t in named:
        rows.append([name, list(t.shape), str(t.dtype).removeprefix("torch.")])
    return sorted(rows)


def state_summary(module: torch.nn.Module) -> dict[str, Any]:
    """How many tensors and elements, and a digest of the names, shapes and dtypes.

    A digest rather than the list keeps ``acache key --explain`` readable for a
    model with hundreds of tensors; ``state_spec`` gives the list itself.
    """
    rows = state_spec(module)
    text = "\n".join(f"{n}\0{shape}\0{dt}" for n, shape, dt in rows)
    elements = 0
    for _, shape, _ in rows:
        n = 1
        for d in shape:
            n *= d
        elements += n
    return {
        "tensors": len(rows),
        "elements": elements,
        "spec": "sha256:" + hashlib.sha256(text.encode()).hexdigest(),
    }


def state_digest(module: torch.nn.Module) -> str:
    """``blake3:<hex>`` over every parameter's and buffer's name, dtype, shape and bytes."""
    import blake3
    import torch

    h = blake3.blake3()
    named = dict(module.named_parameters(remove_duplicate=False))
    named.update(dict(module.named_buffers(remove_duplicate=False)))
    for name in sorted(named):
        t = named[name].detach()
        h.update(f"{name}\0{t.dtype}\0{list(t.shape)}\n".encode())
        flat = t.to("cpu").contiguous().reshape(-1)
        if flat.numel():
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    return "blake3:" + h.hexdigest()


# ------------------------------------------------------------- construction --


def normalize_dynamic(
    dynamic_shapes: Any, n_inputs: int, inputs: Sequence[InputSpec]
) -> tuple[dict[int, tuple[int, int]], ...]:
    """Per input {dim: (min, max)} from a sequence of None | {dim: Dim | (min, max)}."""
    if dynamic_shapes is None:
        return ()
    if isinstance(dynamic_shapes, Mapping) or not isinstance(dynamic_shapes, Sequence):
        raise ModelSpecError(
            "dynamic_shapes must be a list with one entry per input: None or {dim: (min, max)}"
        )
    if len(dynamic_shapes) != n_inputs:
        raise ModelSpecError(
            f"dynamic_shapes has {len(dynamic_shapes)} entries for {n_inputs} inputs"
        )
    out = []
    for i, (dims, spec) in enumerate(zip(dynamic_shapes, inputs, strict=True)):
        norm: dict[int, tuple[int, int]] = {}
        for d, rng in (dims or {}).items():
            if not isinstance(d, int) or not 0 <= d < len(spec.shape):
                raise ModelSpecError(f"dynamic_shapes[{i}]: {d!r} is not a dimension of input {i}")
            lo, hi = (getattr(rng, "min", None), getattr(rng, "max", None))
            if isinstance(rng, tuple):
                lo, hi = rng
            if not isinstance(lo, int) or not isinstance(hi, int) or hi >= sys.maxsize // 2:
                raise ModelSpecError(
                    f"dynamic_shapes[{i}][{d}]: give a bounded range, (min, max) or "
                    "torch.export.Dim(name, min=..., max=...)"
                )
            if not lo <= spec.shape[d] <= hi or lo < 1:
                raise ModelSpecError(
                    f"dynamic_shapes[{i}][{d}]: range {lo}..{hi} must hold the example's "
                    f"size {spec.shape[d]} and start at 1 or more"
                )
            norm[d] = (lo, hi)
        out.append(norm)
    return tuple(out)


def make_spec(
    model: Any,
    example_inputs: Any,
    *,
    device: str | None = None,
    dtype: str | None = None,
    dynamic_shapes: Any = None,
    name: str | None = None,
    version: str | None = None,
    origin: str = "python",
) -> ModuleSpec:
    """Validate the user's module and inputs; move/cast the module when asked to."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ModelSpecError(f"expected a torch.nn.Module, got {type(model).__name__}")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(args, (tuple, list)) or not all(isinstance(a, torch.Tensor) for a in args):
        raise ModelSpecError("example_inputs must be a tensor or a tuple of tensors (positional)")
    first = next(iter(model.parameters()), None)
    if device is None:
        device = str(first.device) if first is not None else "cpu"
    if dtype is None:
        dtype = (
            dtype_name(first.dtype) if first is not None and first.is_floating_point() else "fp32"
        )
    if dtype not in FLOAT_DTYPES:
        raise ModelSpecError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    if device == "cuda":
        device = "cuda:0"
    from ..devices import check_device

    check_device(device)  # before the move: a GPU torch cannot see is one line, not a traceback
    model.to(device=device, dtype=torch_dtype(dtype))
    moved = tuple(
        a.to(device=device, dtype=torch_dtype(dtype)) if a.is_floating_point() else a.to(device)
        for a in args
    )
    inputs = tuple(InputSpec(tuple(a.shape), dtype_name(a.dtype)) for a in moved)
    dynamic = normalize_dynamic(dynamic_shapes, len(inputs), inputs)
    for label, value in (("name", name), ("version", version)):
        if value is not None and not isinstance(value, str):
            raise ModelSpecError(f"{label} must be a string, got {type(value).__name__}")
    return ModuleSpec(
        module=model, inputs=inputs, example_inputs=moved, dynamic=dynamic, name=name,
        version=version, origin=origin, device=device, dtype=dtype,
    )  # fmt: skip


def _import_target(target: str) -> Any:
    """The module a spec's left half names: a dotted module or a .py path."""
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ModelSpecError(f"model spec: no file {target}")
        # Named by the file's stem, not its path: class names are key factors, and the
        # same file in another checkout must give the same key.
        mod_name = f"acache_file_{path.stem}"
        loaded = sys.modules.get(mod_name)
        if loaded is not None and Path(getattr(loaded, "__file__", "")) == path:
            return loaded
        if loaded is not None:  # another file of that name: keep both apart
            mod_name += "_" + hashlib.sha256(str(path).encode()).hexdigest()[:8]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module  # classes need their module for inspect.getsource
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[mod_name]
            raise ModelSpecError(f"model spec: importing {target} raised {_one_line(e)}") from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise ModelSpecError(f"model spec: cannot import {target!r} ({e})") from None
    except Exception as e:
        raise ModelSpecError(f"model spec: importing {target!r} raised {_one_line(e)}") from None


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def is_module_spec(text: str) -> bool:
    """Whether a positional CLI argument names a factory (``x:y``) rather than a recipe."""
    return ":" in text and not text.endswith(".toml")


def resolve_factory(spec: str) -> Any:
    """The factory ``pkg.mod:factory`` names (imported, not called); one-line errors."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr.isidentifier():
        raise ModelSpecError(
            f"model spec {spec!r}: expected pkg.module:factory or path/to/file.py:factory"
        )
    factory = getattr(_import_target(target), attr, None)
    if not callable(factory):
        raise ModelSpecError(f"model spec {spec!r}: {target} has no callable {attr!r}")
    return factory


def check_cli_spec(
    spec: str, inputs: Sequence[str] | None, dtype: str, batch: int | None = None
) -> None:
    """What a parent can check before spawning probes: the factory imports, inputs parse."""
    resolve_factory(spec)
    for text in inputs or []:
        parse_input(text, model_dtype=dtype)
    if batch is not None and batch < 1:
        raise ModelSpecError(f"--batch must be at least 1, got {batch}")


def call_factory(spec: str, *, seed: int = 0) -> tuple[Any, Any]:
    """(module, example_inputs or None) from ``pkg.mod:factory``; one-line errors."""
    import torch

    factory = resolve_factory(spec)
    torch.manual_seed(seed)  # random init is the same in every process: ort/trt key on it
    try:
        made = factory()
    except Exception as e:
        raise ModelSpecError(f"model spec {spec!r}: the factory raised {_one_line(e)}") from None
    if isinstance(made, torch.nn.Module):
        return made, None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        return made
    raise ModelSpecError(
        f"model spec {spec!r}: the factory returned {type(made).__name__}; "
        "return a torch.nn.Module or a (module, example_inputs) pair"
    )


def spec_from_cli(
    spec: str,
    inputs: Sequence[str] | None,
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    seed: int = 0,
    batch: int | None = None,
    name: str | None = None,
    version: str | None = None,
) -> ModuleSpec:
    """A ModuleSpec from the CLI's ``SPEC --input ...``: the factory's inputs unless given."""
    import torch

    model, examples = call_factory(spec, seed=seed)
    model.eval()
    if inputs:
        specs = tuple(parse_input(t, model_dtype=dtype) for t in inputs)
    elif examples is not None:
        ex = (examples,) if isinstance(examples, torch.Tensor) else tuple(examples)
        if not all(isinstance(a, torch.Tensor) for a in ex):
            raise ModelSpecError(f"model spec {spec!r}: example inputs must be tensors")
        if batch is not None:  # the factory's own values, repeated or cut along dimension 0
            ex = tuple(a[torch.arange(batch) % a.shape[0]] if a.dim() else a for a in ex)
        return make_spec(
            model, ex, device=device, dtype=dtype, origin=spec, name=name, version=version
        )
    else:
        raise ModelSpecError(
            f"model spec {spec!r}: the factory returns no example inputs; "
            "give their shapes with --input, e.g. --input 1x3x224x224"
        )
    if batch is not None:
        specs = with_batch(specs, batch)
    gen = torch.Generator().manual_seed(seed)
    made = tuple(s.make("cpu", gen) for s in specs)
    return make_spec(
        model, made, device=device, dtype=dtype, origin=spec, name=name, version=version
    )
