"""Text encoders from transformers' own classes, for ``examples/text.py:NAME``.

``bert_base`` is BERT-base sized (12 layers, hidden 768, 110M parameters) with
random weights; ``tiny_bert`` is the same classes at 2 layers and hidden 32, for CPU
tests. Both return ``(module, (input_ids, attention_mask))`` and the module returns
the last hidden state, one tensor::

    acache build examples/text.py:bert_base --backend ort
    acache bench examples/text.py:tiny_bert --backend aoti --batch 1,32
"""

from __future__ import annotations

import torch
from torch import nn


class Encoder(nn.Module):
    """BertModel -> last hidden state (a tensor, not a ModelOutput)."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def _encoder(seq: int, **config) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    try:
        from transformers import BertConfig
    except ImportError:
        raise RuntimeError("transformers is not installed: pip install transformers") from None
    cfg = BertConfig(attn_implementation="sdpa", **config)
    model = Encoder(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, seq))
    return model, (ids, torch.ones_like(ids))


def bert_base() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _encoder(128)  # BertConfig's defaults are bert-base-uncased's shape


def tiny_bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _encoder(
        16, vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
