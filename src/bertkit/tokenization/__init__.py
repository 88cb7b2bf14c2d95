"""BERT's WordPiece tokenizer, token-for-token and offset-for-offset equal to Hugging Face's BertTokenizerFast.

    from bertkit.tokenization import BertTokenizer
    tok = BertTokenizer.from_pretrained("models/minilm")
    enc = tok("Who wrote it?", "It was written by ...", max_length=128, truncation="only_second",
              padding="max_length", return_tensors="pt", return_offsets_mapping=True)

What each module does, and why the tokenizer behaves as it does: docs/tokenizer.md.
"""

from bertkit.tokenization.added_token import AddedToken
from bertkit.tokenization.auto import AutoTokenizer
from bertkit.tokenization.basic import BasicTokenizer
from bertkit.tokenization.encoding import BatchEncoding, CharSpan, TokenSpan
from bertkit.tokenization.tokenizer import BertTokenizer, BertTokenizerFast
from bertkit.tokenization.wordpiece import WordPiece, load_vocab

__all__ = ["AddedToken", "AutoTokenizer", "BasicTokenizer", "BatchEncoding", "BertTokenizer", "BertTokenizerFast",
           "CharSpan", "TokenSpan", "WordPiece", "load_vocab"]
