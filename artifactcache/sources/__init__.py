"""Where a model comes from.

- A built-in recipe (``artifactcache/recipes/*.toml``) or a recipe TOML file:
  ``artifactcache.recipes.load_recipe`` parses both.
- A Hugging Face checkpoint folder: ``sources.hf`` turns its config.json into a
  recipe (``load_recipe(DIR)`` calls it), and checks a ``--weights`` folder's
  config.json against a recipe.
- ``sources.checkpoint``: the only code that reads a checkpoint folder's files:
  which of them the loader reads (the one rule that the weights digest, keys.py,
  and the loader, models/weights.py, share), its config.json, and what it says
  about generation (EOS ids, tokenizer.json).
- Any ``nn.Module``, as a model spec (``pkg.mod:factory`` / ``file.py:factory``) or
  an object: ``sources.module`` gives its inputs, its fingerprint and its spec.

Nothing here imports torch at module level.
"""
