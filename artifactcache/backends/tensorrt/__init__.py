"""trt: TensorRT engines (ONNX -> engine, the default), and TensorRT-LLM on request.

UNVERIFIED on real TensorRT: this backend is written to NVIDIA's documented Python
APIs (TensorRT 10.x/11.x, the TensorRT-LLM LLM API), but TensorRT cannot be
installed on any machine this project has, so no engine has been built or run by
this code. What is tested here is everything around the TensorRT calls, and the
names of the TensorRT API the code touches (see docs/tensorrt.md).

Modules, Polygraphy-style; ``tensorrt`` is imported only inside functions:
  backend.py  the Backend (registered as ``trt``): availability, options, key factors,
              dispatch to the two modes
  options.py  the mode, the --extra options and the precision plan
  loader.py   ``--mode onnx`` (the default) build: ONNX parser -> builder config, profiles,
              timing cache -> serialized engine (``build_engine`` takes any ONNX file)
  runner.py   ``--mode onnx`` load: runtime -> engine -> execution contexts -> StepRunner
  util.py     versions, the plan header, the compatibility check before deserializing
  llm.py      ``--mode llm`` (asked for by name): TensorRT-LLM's LLM API, build and run

Any nn.Module reaches TensorRT through tensorrt/module.py, which reuses
``loader.build_engine`` and util's compatibility check.
"""

from .backend import BACKEND, TrtBackend

__all__ = ["BACKEND", "TrtBackend"]
