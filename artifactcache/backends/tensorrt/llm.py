"""TensorRT-LLM path of ``--backend trt`` (``--mode llm``, asked for by name; the default
is ``--mode onnx``, plain TensorRT, loader.py/runner.py).

Build: the recipe's model (seeded or from ``--weights``) is written as a Hugging
Face checkpoint (config.json + model.safetensors; our module names mirror
transformers', so this is a plain state_dict dump) into a temp dir, and
TensorRT-LLM's LLM API builds it with a BuildConfig from the recipe's shapes;
``llm.save()`` writes the engine directory, which is the cached artifact.

Load: ``LLM(model=<engine dir>)`` and greedy generation through SamplingParams
(top_k=1, ignore_eos, exactly max_new_tokens); ``logits()`` asks for context
logits, which the engine only returns because it is built with
``gather_context_logits=True``.

UNVERIFIED: written to the TensorRT-LLM LLM API documentation and source
(``tensorrt_llm._tensorrt_engine.LLM`` on 1.0-1.2, where ``tensorrt_llm.LLM`` is the
PyTorch backend; ``tensorrt_llm.LLM`` on 0.x). TensorRT-LLM 1.3 on has no engine
backend: engine_backend_problem() refuses it at argument time. TensorRT-LLM cannot
be installed on any machine this project has. The checkpoint writer is tested here against
transformers (tests/test_backends_tensorrt_llm.py), since that is what TensorRT-LLM reads.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...devices import device_index
from ...dtypes import DTYPES
from ...errors import BackendError, ShapeError

if TYPE_CHECKING:
    from ...choices import BuildChoices
    from ...config import Recipe
    from ..base import BuildContext

_ARCH = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "phi-3": ("Phi3ForCausalLM", "phi3"),
    "phi-2": ("PhiForCausalLM", "phi"),
}


def check_family(recipe: Recipe) -> None:
    """Refuse, before any work, a family this writer has no TensorRT-LLM config for."""
    if recipe.family not in _ARCH:
        raise BackendError(
            f"trt --mode llm does not build family {recipe.family} yet "
            f"(it builds {', '.join(_ARCH)}); drop --mode llm (the default, --mode onnx, "
            "is plain TensorRT), or use backend aoti"
        )


def hf_config(recipe: Recipe, dtype: str) -> dict[str, Any]:
    """A transformers config.json describing the recipe's architecture."""
    m = recipe.model
    check_family(recipe)
    arch, model_type = _ARCH[recipe.family]
    cfg: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": m.vocab_size,
        "hidden_size": m.dim,
        "intermediate_size": m.intermediate_size,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.n_kv_heads,
        "max_position_embeddings": m.max_position_embeddings,
        "rope_theta": m.rope_theta,
        "tie_word_embeddings": m.tie_embeddings,
        "torch_dtype": DTYPES[dtype].torch_name,
        "use_cache": True,
    }
    if recipe.family == "phi-2":
        cfg.update(
            hidden_act="gelu_new",
            layer_norm_eps=m.norm_eps,
            partial_rotary_factor=m.partial_rotary_factor,
            qk_layernorm=False,
        )
    else:
        cfg.update(hidden_act="silu", rms_norm_eps=m.norm_eps, attention_bias=False)
    if recipe.family == "mistral":
        cfg["sliding_window"] = m.sliding_window
    if recipe.family == "phi-3":
        cfg.update(sliding_window=None, original_max_position_embeddings=m.max_position_embeddings)
    if m.rope_scaling:
        cfg["rope_scaling"] = {**m.rope_scaling, "rope_type": m.rope_scaling["type"]}
    return cfg


def write_hf_checkpoint(ctx: BuildContext, out: Path, dtype: str) -> Path:
    """config.json + model.safetensors of the recipe's model with ctx's weights."""
    from safetensors.torch import save_file

    from ...models import build_model

    model = build_model(ctx.recipe, device="cpu", dtype=dtype, weights=ctx.weights)
    tied = ctx.recipe.model.tie_embeddings
    state = {
        k: v.detach().contiguous().clone()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")  # safetensors refuses shared storage
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(ctx.recipe, dtype), indent=2) + "\n")
    return out


def build_config_kwargs(recipe: Recipe, opts: BuildChoices) -> dict[str, Any]:
    """BuildConfig arguments from the recipe's shapes (also a key factor)."""
    check_family(recipe)
    s = recipe.shapes
    return {
        "max_batch_size": s.max_batch,
        # TensorRT-LLM runs a whole prompt in its context phase, so a prompt may take
        # the context (Recipe.check_fits leaves room for the new tokens). Without
        # chunked context one prompt must fit in a step's token budget; prefill_len
        # sizes that budget for a batch of short prompts.
        "max_input_len": s.max_seq_len,
        "max_seq_len": s.max_seq_len,
        "max_num_tokens": max(s.max_batch * s.prefill_len, s.max_seq_len),
        "max_beam_width": 1,
        # Needed for Runner.logits(): without it the engine returns no prompt logits.
        "gather_context_logits": True,
    }


def sampling_kwargs(max_new_tokens: int, context_logits: bool = False) -> dict[str, Any]:
    """Greedy, no early stop: exactly max_new_tokens ids, like every other backend."""
    return {
        "max_tokens": max_new_tokens,
        "top_k": 1,
        "temperature": 0.0,
        "ignore_eos": True,
        # With skip_tokenizer_init there is no tokenizer to supply end/pad ids, and
        # SamplingParams._setup would read them from it; TensorRT-LLM itself sends
        # end_id=-1 to the executor when ignore_eos is set.
        "end_id": -1,
        "pad_id": 0,
        "detokenize": False,
        "return_context_logits": context_logits,
    }


# TensorRT-LLM 1.3 (its main branch from July 2026) removed the TensorRT engine backend
# (tensorrt_llm._tensorrt_engine, trtllm-build); the trtllm extra pins tensorrt-llm<1.3.
ENGINE_BACKEND_BEFORE = (1, 3)


def engine_backend_problem() -> str | None:
    """Why the installed TensorRT-LLM cannot build or run engines (one line), else None.

    Read without importing it (slow, and it prints a banner): the distribution's version,
    and on 1.x whether ``tensorrt_llm/_tensorrt_engine`` (the LLM _llm_class uses) is
    there. None when it is not installed (available() says so) or has no version.
    """
    import importlib.machinery
    import importlib.util
    import re

    from ...extras import install_hint
    from ...keys import package_version

    version = package_version("tensorrt_llm")
    m = re.match(r"(\d+)\.(\d+)", version or "")
    spec = importlib.util.find_spec("tensorrt_llm") if m else None
    if m is None or spec is None:
        return None
    release = (int(m[1]), int(m[2]))  # 1.3.0rc1 counts as 1.3, though PEP 440 sorts it lower
    where = list(spec.submodule_search_locations or [])
    engine = importlib.machinery.PathFinder.find_spec("tensorrt_llm._tensorrt_engine", where)
    if release < ENGINE_BACKEND_BEFORE and (release < (1, 0) or engine is not None):
        return None
    return (
        f"TensorRT-LLM {version} has no TensorRT engine backend (tensorrt_llm._tensorrt_engine; "
        f"removed in 1.3), which --mode llm builds and runs: {install_hint('trt-llm')} "
        "(pins tensorrt-llm<1.3), or drop --mode llm (the default, --mode onnx, is plain "
        "TensorRT: no TensorRT-LLM)"
    )


def _llm_class() -> Any:
    try:  # TensorRT-LLM 1.x: the TensorRT-engine LLM lives here
        from tensorrt_llm._tensorrt_engine import LLM
    except ImportError:  # 0.x: tensorrt_llm.LLM is the TensorRT-engine LLM
        from tensorrt_llm import LLM
    return LLM


def build_llm_engine(ctx: BuildContext, engine_dir: Path) -> dict[str, Any]:
    import tensorrt_llm
    from tensorrt_llm import BuildConfig

    from ...keys import package_version

    opts = ctx.opts
    kw = build_config_kwargs(ctx.recipe, opts)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="acache-hf-") as tmp:
        hf_dir = write_hf_checkpoint(ctx, Path(tmp) / "hf", opts.dtype)
        llm = _llm_class()(
            model=str(hf_dir),
            build_config=BuildConfig(**kw),
            dtype=DTYPES[opts.dtype].torch_name,
            skip_tokenizer_init=True,
        )
        try:
            llm.save(str(engine_dir))
        finally:
            llm.shutdown()
    if not (engine_dir / "config.json").is_file():
        raise BackendError(f"TensorRT-LLM wrote no engine config into {engine_dir.name}/")
    import torch

    props = torch.cuda.get_device_properties(device_index(opts.device))
    return {
        "tensorrt_llm": tensorrt_llm.__version__,
        "tensorrt": package_version("tensorrt"),
        "compute_capability": f"{props.major}.{props.minor}",
        "build_config": kw,
        "engine_build_seconds": round(time.perf_counter() - t0, 3),
    }


class TrtLlmRunner:
    """Runner over TensorRT-LLM's LLM API (see backends/base.py)."""

    def __init__(self, llm: Any, recipe: Recipe) -> None:
        self.llm, self.recipe = llm, recipe
        self.checkpoint: Any = None  # api.load sets it (EOS ids, tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self.checkpoint.tokenizer if self.checkpoint is not None else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.checkpoint.eos_token_ids if self.checkpoint is not None else ()

    def _generate(self, ids: list[int], n: int, context_logits: bool) -> Any:
        return self._generate_all([ids], n, context_logits)[0]

    def _generate_all(self, prompts: list[list[int]], n: int, context_logits: bool) -> Any:
        from tensorrt_llm import SamplingParams

        vocab = self.recipe.model.vocab_size
        for ids in prompts:
            for t in ids:
                if not 0 <= t < vocab:
                    raise ShapeError(f"token id {t} is outside the vocabulary [0, {vocab})")
        params = SamplingParams(**sampling_kwargs(n, context_logits))
        return self.llm.generate(prompts, params, use_tqdm=False)

    def logits(self, token_ids: list[int]) -> Any:
        ids = [int(t) for t in token_ids]
        self.recipe.check_fits(len(ids), 0)
        out = self._generate(ids, 1, context_logits=True)
        if out.context_logits is None:
            raise BackendError("the engine returned no context logits: rebuild it with --force")
        return out.context_logits.float().cpu().reshape(len(ids), -1)

    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> list[int]:
        return self.generate_batch(
            [prompt_ids], max_new_tokens, eos_token_ids=eos_token_ids, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed,
        )[0]  # fmt: skip

    def generate_batch(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        *,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
    ) -> list[list[int]]:
        """The prompts as one request list; the engine batches them (max_batch_size)."""
        from ...generate import Sampling, cut_at_eos, resolve_eos_ids

        rows = [[int(t) for t in p] for p in prompts]
        if not rows:
            raise ShapeError("the batch is empty: give at least one prompt")
        if not Sampling(temperature, top_k, top_p, seed).greedy:
            # Not wired to TensorRT-LLM's SamplingParams yet, and never silently ignored.
            raise BackendError("the trt-llm runner generates greedily only: use temperature 0")
        eos = resolve_eos_ids(eos_token_ids, self.eos_token_ids, self.recipe.model.vocab_size)
        for ids in rows:
            self.recipe.check_fits(len(ids), max_new_tokens, len(rows))
        if max_new_tokens == 0:
            return [[] for _ in rows]
        # The engine runs with ignore_eos (sampling_kwargs); the EOS cut happens here.
        outs = self._generate_all(rows, max_new_tokens, False)
        return [cut_at_eos(list(o.outputs[0].token_ids), eos) for o in outs]

    def stream(self, prompt_ids: list[int], max_new_tokens: int, **choices: Any) -> Any:
        """generate()'s ids, all at once: the LLM API returns a whole request."""
        return iter(self.generate(prompt_ids, max_new_tokens, **choices))


def load_llm_runner(ctx: BuildContext, engine_dir: Path, meta: dict[str, Any]) -> TrtLlmRunner:
    import tensorrt_llm
    import torch

    from ...keys import package_version
    from .util import EngineIncompatible, compat_problem

    props = torch.cuda.get_device_properties(device_index(ctx.opts.device))
    problem = compat_problem(meta, package_version("tensorrt"), f"{props.major}.{props.minor}")
    if problem is None and meta.get("tensorrt_llm") != tensorrt_llm.__version__:
        problem = (
            f"engine built with TensorRT-LLM {meta.get('tensorrt_llm')}, "
            f"this runtime is {tensorrt_llm.__version__}"
        )
    if problem:
        raise EngineIncompatible(f"stale entry {engine_dir.parent.name[:12]}: {problem}")
    llm = _llm_class()(model=str(engine_dir), skip_tokenizer_init=True)
    ctx.phases["weights_ready"] = ctx.phases["artifact_ready"] = time.perf_counter()
    return TrtLlmRunner(llm, ctx.recipe)
