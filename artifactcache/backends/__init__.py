"""Backends: one folder each, holding its LLM-recipe path and its nn.Module path.

::

    backends/
      base.py            the Backend and ModuleBackend protocols, BuildContext, the registry
                         (ctx.opts is the user's BuildChoices, artifactcache/choices.py)
      shared/            what more than one backend uses
        runner.py          StepRunner: generation over compiled prefill/decode steps
        model_options.py   fusion, quantization, split-KV decode: checks and key factors
        cuda_graph.py      CUDA-graph capture of a decode step (at load)
        cxx.py             C++ compiler probes for Inductor and AOTInductor
        tuning.py          Inductor autotuning options
        build_plan.py      an aoti or inductor build serial or in workers, and their limits
        build_jobs.py      the steps each in a worker process (build_worker.py)
        cpu_clock.py       the CPU seconds of a build's finished child processes (g++)
        torch_private.py   every private torch API acache touches, in one place
        any_module.py      the reference run, records and CompiledModule of the nn.Module path
      eager/             backend.py, module.py
      inductor/          backend.py, module.py, compiling.py (the build, serial or in
                         workers), files.py (Mega-Cache and kernel files),
                         autotune_cache.py (tuning results a warm process trusts)
      aoti/              backend.py, module.py
      onnx/              the "ort" backend: backend.py, module.py; export.py and
                         export_module.py (the ONNX export TensorRT reads too)
      tensorrt/          the "trt" backend: backend.py, module.py, loader.py, runner.py,
                         options.py, util.py, llm.py (TensorRT-LLM)

A backend's key covers its folder, every backend folder it imports, and shared/
(``code_factors.backend_sources``).
"""
