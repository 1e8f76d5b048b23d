"""Run a public reference implementation's own model and pipeline code on CPU, next to the pack.

The references (Self-Forcing, Rolling Forcing, LongLive 1.0 and 2.0, CausVid, Causal Forcing, Krea Realtime) are
not part of this repository: ``tools/extract_references.py`` writes them to ``$FASTAR_REFERENCE_DIR/<name>/`` and the
parity tests import them from there. They all use the same top-level package names (``wan``, ``utils``,
``pipeline``, ...), so each is imported in isolation: ``reference_modules`` puts one reference first on the path,
serves its modules through a finder that can rewrite named constants in their source, and removes every module
it loaded on exit.

Everything that differs from running the reference as published is one of the patches below, each named by
what it replaces and why; none touches the math of a forward or of the sampling loop:

- ``diffusers`` stand-in: ``ModelMixin`` is ``nn.Module`` and ``from_pretrained(path, **kw)`` builds the class
  from the tiny config instead of reading ``wan_models/<name>/config.json`` (no 1.3B weights here);
  ``register_to_config`` is the identity and ``ConfigMixin`` empty (they only record constructor arguments).
- ``einops`` stand-in when it is not installed: its ``repeat`` is used only by the GAN classifier branch.
- ``flash_attn``/``flash_attn_interface`` absent, so the references take their SDPA fallback, and
  ``wan.modules.attention.attention``/``flash_attention`` run that same SDPA in the inputs' dtype: the
  published fallback casts q/k/v to bf16 first (CUDA kernels need it; here everything stays fp32).
- ``torch.compile`` is the identity while the reference is imported (it wraps ``flex_attention`` at import;
  the inference paths under test never call the compiled training mask path on CPU).
- package ``__init__`` files (``wan``, ``wan.modules``, ``pipeline``, ``model``, ...) are not executed: they
  import the T5 encoder, the VAE, tokenizers (``ftfy``, ``transformers``), training pipelines and distributed
  code that inference from given text features and latents never runs; modules are imported one by one;
  the T5, tokenizer, VAE and CLIP modules are placeholders that raise if used; ``demo_utils.memory`` and
  ``utils.memory`` (``torch.cuda.current_device()`` at import) are stand-ins with ``gpu = cpu``.
- geometry constants written for the 1.3B model at 480x832 (1560 tokens per frame, 32760 = 21 frames of
  them, 30 blocks, 12 heads x 128) are rewritten to the tiny model's values, listed per reference in the
  test file; each rewrite must match the expected number of occurrences, so a changed reference fails loudly.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

REFERENCE_DIR = os.environ.get("FASTAR_REFERENCE_DIR")
# Top-level names the references use for their own packages; cleared before and after each one.
REFERENCE_TOPLEVEL = ("wan", "wan_5b", "utils", "pipeline", "model", "demo_utils", "trainer", "causvid", "settings",
                      "release_server", "v2v", "minimal_inference", "diffusers", "einops")


def reference_root(name: str) -> Path:
    return Path(REFERENCE_DIR) / name


def reference_commit(name: str) -> str:
    path = reference_root(name) / "REFERENCE_COMMIT"
    return path.read_text().strip() if path.exists() else "(unknown commit)"


@dataclass
class Rewrite:
    """Replace ``old`` by ``new`` in one module's source; ``count`` occurrences must exist."""

    module: str
    old: str
    new: str
    count: int = 1
    why: str = ""


@dataclass
class ReferenceSpec:
    name: str  # folder under FASTAR_REFERENCE_DIR
    rewrites: list = field(default_factory=list)
    package_root: str = ""  # sub-folder that holds the top-level packages (CausVid keeps them under causvid/)
    empty_packages: tuple = ("wan", "wan.modules", "wan.utils", "pipeline", "utils", "model", "demo_utils")
    # Modules replaced by placeholders whose every name raises when used: text encoder, tokenizer, VAE, CLIP.
    unused_modules: tuple = ("wan.modules.t5", "wan.modules.tokenizers", "wan.modules.vae", "wan.modules.clip")
    # Server / IO libraries imported at module level but never reached by the code under test.
    inert_modules: tuple = ()
    extra_modules: dict = field(default_factory=dict)


def _sdpa_attention(q, k, v, q_lens=None, k_lens=None, dropout_p=0.0, softmax_scale=None, q_scale=None,
                    causal=False, window_size=(-1, -1), deterministic=False, dtype=None, version=None,
                    fa_version=None):
    """The references' SDPA fallback ([B, L, H, D] in and out) without its cast to bf16."""
    if q_scale is not None:
        q = q * q_scale
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, dropout_p=dropout_p, scale=softmax_scale)
    return out.transpose(1, 2).contiguous()


def _diffusers_stub(tiny_config: dict) -> dict:
    diffusers = types.ModuleType("diffusers")
    configuration_utils = types.ModuleType("diffusers.configuration_utils")
    models = types.ModuleType("diffusers.models")
    modeling_utils = types.ModuleType("diffusers.models.modeling_utils")

    class ConfigMixin:
        pass

    def register_to_config(fn):
        return fn

    class ModelMixin(torch.nn.Module):
        @classmethod
        def from_pretrained(cls, path, **kwargs):
            model = cls(**{**tiny_config, **kwargs})
            model.config = types.SimpleNamespace(**{**tiny_config, **kwargs})  # what register_to_config keeps
            return model

    configuration_utils.ConfigMixin = ConfigMixin
    configuration_utils.register_to_config = register_to_config
    modeling_utils.ModelMixin = ModelMixin
    diffusers.configuration_utils = configuration_utils
    diffusers.models = models
    models.modeling_utils = modeling_utils
    return {"diffusers": diffusers, "diffusers.configuration_utils": configuration_utils,
            "diffusers.models": models, "diffusers.models.modeling_utils": modeling_utils}


def _einops_stub() -> dict:
    try:
        import einops  # noqa: F401

        return {}
    except ImportError:
        stub = types.ModuleType("einops")

        def repeat(*_a, **_k):
            raise RuntimeError("einops.repeat stand-in: only the GAN branch uses it")

        stub.repeat = stub.rearrange = repeat
        return {"einops": stub}


def _unused_module(name: str) -> types.ModuleType:
    """A module whose every attribute is a placeholder that raises when called (the parity runs feed text
    features and latents directly, so the T5 encoder, tokenizer, VAE and CLIP are imported but never run)."""
    module = types.ModuleType(name)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        class Unused:
            def __init__(self, *a, **k):
                raise RuntimeError(f"{name}.{attr} is a stand-in: parity runs do not use it")

        Unused.__name__ = attr
        return Unused

    module.__getattr__ = __getattr__
    return module


class _Inert:
    """Anything: attribute access and calls give another ``_Inert``; used as a decorator it returns the
    function unchanged (``@app.get("/")``)."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _Inert()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


def inert_module(name: str) -> types.ModuleType:
    """A server/IO library (FastAPI, msgpack, OpenCV, ...) imported at module level and never used by the
    inference code under test."""
    module = types.ModuleType(name)
    module.__path__ = []

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Inert

    module.__getattr__ = __getattr__
    return module


def _memory_stub() -> types.ModuleType:
    stub = types.ModuleType("demo_utils.memory")
    stub.gpu = torch.device("cpu")
    stub.cpu = torch.device("cpu")

    def unavailable(*_a, **_k):
        raise RuntimeError("demo_utils.memory stand-in: low-memory offloading is not used in parity runs")

    for fn in ("get_cuda_free_memory_gb", "move_model_to_device_with_memory_preservation", "log_gpu_memory",
               "offload_model_from_device_for_memory_preservation", "unload_complete_models", "load_model_as_needed",
               "fake_diffusers_current_device"):
        setattr(stub, fn, unavailable)
    stub.DynamicSwapInstaller = type("DynamicSwapInstaller", (), {"install_model": staticmethod(unavailable)})
    return stub


class _RewritingLoader(importlib.abc.SourceLoader):
    def __init__(self, fullname, path, rewrites, after_exec):
        self.fullname, self.path = fullname, path
        self.rewrites, self.after_exec = rewrites, after_exec

    def get_filename(self, fullname):
        return self.path

    def get_data(self, path):
        source = Path(path).read_text()
        for rw in self.rewrites:
            found = source.count(rw.old)
            if found != rw.count:
                raise AssertionError(f"{self.fullname}: expected {rw.count} occurrence(s) of {rw.old!r} to rewrite, "
                                     f"found {found} (the reference changed; update the patch list)")
            source = source.replace(rw.old, rw.new)
        return source.encode()

    def exec_module(self, module):
        super().exec_module(module)
        hook = self.after_exec.get(self.fullname)
        if hook is not None:
            hook(module)


class _ReferenceFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path, rewrites, after_exec):
        self.root = root
        self.rewrites = rewrites
        self.after_exec = after_exec
        self.used = set()

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        base = self.root.joinpath(*parts)
        if (base / "__init__.py").is_file():
            file, is_pkg = base / "__init__.py", True
        elif base.with_suffix(".py").is_file():
            file, is_pkg = base.with_suffix(".py"), False
        else:
            return None
        mine = [rw for rw in self.rewrites if rw.module == fullname]
        self.used.update(id(rw) for rw in mine)
        loader = _RewritingLoader(fullname, str(file), mine, self.after_exec)
        spec = importlib.util.spec_from_file_location(fullname, file, loader=loader,
                                                      submodule_search_locations=[str(base)] if is_pkg else None)
        return spec


def _clear_reference_modules():
    for name in list(sys.modules):
        if name.split(".")[0] in REFERENCE_TOPLEVEL:
            del sys.modules[name]


def _patch_attention(module):
    module.attention = _sdpa_attention
    module.flash_attention = _sdpa_attention


@contextlib.contextmanager
def reference_modules(spec: ReferenceSpec, tiny_config: dict):
    """Import context for one reference: ``import_module`` inside it loads that reference's code."""
    root = reference_root(spec.name) / spec.package_root
    if not root.is_dir():
        raise FileNotFoundError(f"{root} does not exist; run tools/extract_references.py --dest {REFERENCE_DIR}")
    _clear_reference_modules()
    after_exec = {"wan.modules.attention": _patch_attention}
    for prefix in ("causvid.models.wan.wan_base.modules.attention", "wan_5b.modules.attention"):
        after_exec[prefix] = _patch_attention
    finder = _ReferenceFinder(root, spec.rewrites, after_exec)
    stubs = {**_diffusers_stub(tiny_config), **_einops_stub(), "flash_attn": None, "flash_attn_interface": None,
             "demo_utils.memory": _memory_stub(), "utils.memory": _memory_stub()}
    stubs.update({name: _unused_module(name) for name in spec.unused_modules})
    stubs.update({name: inert_module(name) for name in spec.inert_modules})
    stubs.update(spec.extra_modules)
    for pkg in spec.empty_packages:
        module = types.ModuleType(pkg)
        module.__path__ = [str(root.joinpath(*pkg.split(".")))]
        stubs[pkg] = module
    saved = {k: sys.modules.get(k) for k in stubs}
    original_compile = torch.compile
    sys.modules.update(stubs)
    for name, module in stubs.items():  # ``import a.b.c as x`` reads the parents' attributes
        parent, _, child = name.rpartition(".")
        if parent in stubs and module is not None:
            setattr(stubs[parent], child, module)
    sys.meta_path.insert(0, finder)
    torch.compile = lambda fn=None, *a, **k: fn if fn is not None else (lambda f: f)
    try:
        yield finder
        unused = [rw for rw in spec.rewrites if id(rw) not in finder.used]
        if unused:
            raise AssertionError(f"rewrites for modules never imported: {[rw.module for rw in unused]}")
    finally:
        torch.compile = original_compile
        sys.meta_path.remove(finder)
        _clear_reference_modules()
        for k, v in saved.items():  # every stand-in leaves; what was imported before comes back
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def import_module(name: str):
    return importlib.import_module(name)


@dataclass
class NoiseDraw:
    chunk: int
    step: int
    tensor: torch.Tensor  # [B, C, F, H, W] as the pack drew it


def record_pack_noise(sampler) -> list:
    """Wrap the sampler's noise source so every draw of the pack is recorded, in order, as a ``NoiseDraw``."""
    draws = []
    make_source = sampler.noise_source

    def recording_source(cfg):
        source = make_source(cfg)

        def draw(chunk, step, frames):
            tensor = source(chunk, step, frames)
            draws.append(NoiseDraw(chunk, step, tensor))
            return tensor

        return draw

    sampler.noise_source = recording_source
    return draws


class NoiseTape:
    """Hands the reference, in order, the noise the pack drew: ``torch.randn``/``randn_like`` are patched to
    return the next recorded draw, laid out by ``layout(draw, shape)`` in the shape the reference asked for."""

    def __init__(self, draws, layout):
        self.draws = list(draws)
        self.layout = layout
        self.served = 0

    def _next(self, shape):
        if self.served >= len(self.draws):
            raise AssertionError(f"the reference drew more noise than the pack ({self.served} draws)")
        draw = self.draws[self.served]
        self.served += 1
        return self.layout(draw, tuple(shape))

    @contextlib.contextmanager
    def patched(self):
        original_randn, original_like = torch.randn, torch.randn_like

        def randn_like(x, *a, **k):
            return self._next(x.shape).to(dtype=x.dtype, device=x.device)

        def randn(*size, generator=None, dtype=None, device=None, **k):
            shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
            return self._next(shape).to(dtype=dtype or torch.float32, device=device or "cpu")

        torch.randn, torch.randn_like = randn, randn_like
        try:
            yield self
        finally:
            torch.randn, torch.randn_like = original_randn, original_like
        if self.served != len(self.draws):
            raise AssertionError(f"the reference drew {self.served} noise tensors, the pack {len(self.draws)}")


def frames_first(draw: NoiseDraw, shape):
    """A pack draw [B, C, F, H, W] in the references' frame-major layout ([B, F, C, H, W] or [B*F, C, H, W])."""
    tensor = draw.tensor.permute(0, 2, 1, 3, 4)
    if tensor.numel() != torch.Size(shape).numel():
        raise AssertionError(f"noise for chunk {draw.chunk} step {draw.step}: the reference asked for {list(shape)}, "
                             f"the pack drew {list(draw.tensor.shape)}")
    return tensor.reshape(shape)


def relative_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    ours, ref = ours.double(), ref.double()
    return ((ours - ref).norm() / ref.norm()).item()


def first_deviating_frame(ours, ref, tol=1e-5, frame_dim=2) -> int | None:
    """First latent frame whose relative error exceeds ``tol`` (None when all are within)."""
    for f in range(ours.shape[frame_dim]):
        a, b = ours.select(frame_dim, f), ref.select(frame_dim, f)
        if relative_error(a, b) > tol:
            return f
    return None


def diffusers_scheduler_modules() -> dict:
    """What Wan's flow schedulers import from diffusers: config recording, empty base classes."""
    configuration = types.ModuleType("diffusers.configuration_utils")

    class ConfigMixin:
        def register_to_config(self, **values):
            self.config = types.SimpleNamespace(**{**vars(getattr(self, "config", types.SimpleNamespace())),
                                                   **values})

    def register_to_config(init):
        signature = inspect.signature(init)

        @functools.wraps(init)
        def wrapped(self, *args, **kwargs):
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            init(self, *args, **kwargs)
            values = {k: v for k, v in bound.arguments.items() if k != "self"}
            if not isinstance(self, torch.nn.Module):  # the model's config is set by from_pretrained
                self.config = types.SimpleNamespace(**values)

        return wrapped

    configuration.ConfigMixin = ConfigMixin
    configuration.register_to_config = register_to_config
    schedulers = types.ModuleType("diffusers.schedulers")
    scheduling = types.ModuleType("diffusers.schedulers.scheduling_utils")
    scheduling.KarrasDiffusionSchedulers = []
    scheduling.SchedulerMixin = type("SchedulerMixin", (), {})
    scheduling.SchedulerOutput = type("SchedulerOutput", (), {"__init__": lambda self, prev_sample: setattr(
        self, "prev_sample", prev_sample)})
    utils = types.ModuleType("diffusers.utils")
    utils.deprecate = lambda *a, **k: None
    utils.is_scipy_available = lambda: False
    torch_utils = types.ModuleType("diffusers.utils.torch_utils")
    torch_utils.randn_tensor = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("randn_tensor is not used"))
    return {"diffusers.configuration_utils": configuration, "diffusers.schedulers": schedulers,
            "diffusers.schedulers.scheduling_utils": scheduling, "diffusers.utils": utils,
            "diffusers.utils.torch_utils": torch_utils}


def tqdm_stub():
    """A ``tqdm`` stand-in (the iterable itself) where tqdm is not installed; None where it is."""
    try:
        import tqdm  # noqa: F401

        return None
    except ImportError:
        stub = types.ModuleType("tqdm")
        stub.tqdm = lambda it=None, *a, **k: it
        return stub
