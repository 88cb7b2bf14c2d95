"""bertkit: BERT (Devlin et al., 2018) from scratch on PyTorch."""

from bertkit.config import BertConfig
from bertkit.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertkit.modeling import BertModel
from bertkit.tokenization import BertTokenizer

__all__ = [
    "BertConfig",
    "BertTokenizer",
    "BertModel",
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertForNextSentencePrediction",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "BertForMultipleChoice",
]
__version__ = "0.1.0"
