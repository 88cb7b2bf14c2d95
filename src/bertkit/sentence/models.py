"""sentence-transformers' ``models`` (``from sentence_transformers import models``), whose modules bertkit does not
assemble: each name is refused, on first use, with what to do instead.

A script that builds its model from modules, ``SentenceTransformer(modules=[models.Transformer(path),
models.Pooling(384)])``, stopped at its import with Python's "cannot import name 'models'", which said nothing of
bertkit's way; now ``models.Transformer(...)`` says it, before anything is loaded or written.
"""

from __future__ import annotations

from bertkit.errors import refusing_getattr
from bertkit.sentence.model import FROM_A_DIRECTORY

_OTHER = "bertkit's SentenceTransformer is a BERT encoder, Pooling and an optional Normalize; use sentence-transformers " \
         "for a model with this module"
_REFUSED = {
    **dict.fromkeys(("Transformer", "Pooling", "Normalize"), FROM_A_DIRECTORY),
    **dict.fromkeys(("Dense", "LayerNorm", "Dropout", "WeightedLayerPooling", "WordEmbeddings", "WordWeights", "LSTM",
                     "CNN", "BoW", "StaticEmbedding", "CLIPModel", "Router", "Asym", "Module", "InputModule",
                     "tokenizer"), _OTHER),
}
__getattr__ = refusing_getattr(__name__, _REFUSED)
