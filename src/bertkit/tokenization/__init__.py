"""BERT's WordPiece tokenizer, token-for-token and offset-for-offset equal to Hugging Face's BertTokenizerFast.

    from bertkit.tokenization import BertTokenizer
    tok = BertTokenizer.from_pretrained("models/minilm")
    enc = tok("Who wrote it?", "It was written by ...", max_length=128, truncation="only_second",
              padding="max_length", return_tensors="pt", return_offsets_mapping=True)

Modules: ``basic`` (clean-up, lower-casing, accents, punctuation/CJK split), ``wordpiece`` (vocab.txt,
greedy longest-match-first), ``encoding`` (special tokens, truncation, padding), ``tokenizer`` (the
``BertTokenizer`` that puts them together), ``trainer`` (learn a vocabulary from a corpus).
"""

from bertkit.tokenization.basic import BasicTokenizer
from bertkit.tokenization.encoding import BatchEncoding
from bertkit.tokenization.tokenizer import BertTokenizer
from bertkit.tokenization.wordpiece import WordPiece, load_vocab

__all__ = ["BasicTokenizer", "BatchEncoding", "BertTokenizer", "WordPiece", "load_vocab"]
