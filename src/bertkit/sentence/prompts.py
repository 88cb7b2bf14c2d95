"""Prompts as sentence-transformers 6 applies them, shared by ``SentenceTransformer`` and ``SparseEncoder``: the
model's named prompts (every model has "query" and "document", "" unless set), the default prompt, which prompt
``encode_query`` / ``encode_document`` put before a text, and how many of a prompted text's tokens are the prompt's
(``prompt_tokens``, what a Pooling with include_prompt False leaves out); and the trainers' check that each of their
``prompts`` names a text column or dataset it can apply to (``check_prompt_columns``)."""

from __future__ import annotations

from typing import Any

from bertkit.errors import BertkitError

# sentence-transformers 6's prompts every model has (``SentenceTransformer._default_prompts``), placeholders that
# become "" unless the caller or the directory sets them: encode_query and encode_document then use no prompt (not
# the default prompt), and encode_document picks "document" before "passage" or "corpus"
DEFAULT_PROMPTS: dict[str, str | None] = {"query": None, "document": None}


def prompt_tokens(tokenizer: Any, prompt: str, max_length: int) -> int:
    """The leading tokens of a text after ``prompt`` that are the prompt's, [CLS] included: as sentence-transformers
    measures them, on the prompt tokenized as a text is, cut at ``max_length`` less its closing [SEP] (a prompt longer
    than max_length leaves the [SEP] to pool, not nothing)."""
    return min(len(tokenizer(prompt)["input_ids"]), max_length) - 1


class Prompted:
    """``prompts``, ``default_prompt_name``; ``encode_query`` / ``encode_document`` over the class's ``encode``."""

    prompts: dict[str, str]
    default_prompt_name: str | None
    encode: Any

    def _set_prompts(self, given: dict[str, str] | None, default_prompt_name: str | None,
                     saved: dict[str, str | None], saved_default: str | None) -> None:
        """As sentence-transformers 6: the caller's prompts over the placeholders, the directory's where neither
        set one (an empty prompt is set), "" for those left; the caller's default_prompt_name, else the
        directory's."""
        merged: dict[str, str | None] = {**DEFAULT_PROMPTS, **(given or {})}
        merged.update({name: text for name, text in saved.items() if merged.get(name) is None})
        self.prompts = {name: text or "" for name, text in merged.items()}
        self.default_prompt_name = default_prompt_name if default_prompt_name is not None else saved_default
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise BertkitError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                               f"{sorted(self.prompts)}")

    def _saved_default_prompt_name(self) -> str | None:
        """``default_prompt_name`` as ``save`` writes it: one the prompts lack (set after loading) is refused naming
        both, as loading the directory would refuse it (sentence-transformers writes it, and neither library then
        loads the directory)."""
        name = self.default_prompt_name
        if name is not None and name not in self.prompts:
            raise BertkitError(f"default_prompt_name {name!r} is not one of this model's prompts {sorted(self.prompts)}, "
                               "so the saved directory would not load; add it to model.prompts or set "
                               "model.default_prompt_name = None before saving")
        return name

    # encode_query and encode_document take encode's arguments in encode's places, as sentence-transformers' do
    # (``*args``: batch_size, show_progress_bar, ...): encode_document(texts, None, None, 16) was Python's "takes from
    # 1 to 4 positional arguments but 5 were given"
    def encode_query(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
                     *args: Any, **kwargs: Any) -> Any:
        """``encode`` for queries: without a prompt given, the model's "query" prompt (every model has one, "" unless
        set, which also keeps ``default_prompt_name`` out, as in sentence-transformers 6)."""
        if prompt_name is None and prompt is None and "query" in self.prompts:
            prompt_name = "query"
        return self.encode(inputs, prompt_name, prompt, *args, **kwargs)

    def encode_document(self, inputs: Any = None, prompt_name: str | None = None, prompt: str | None = None,
                        *args: Any, **kwargs: Any) -> Any:
        """``encode`` for documents: without a prompt given, the model's "document", "passage" or "corpus" prompt,
        the first it has: "document", which every model has ("" unless set), as in sentence-transformers 6."""
        if prompt_name is None and prompt is None:
            prompt_name = next((n for n in ("document", "passage", "corpus") if n in self.prompts), None)
        return self.encode(inputs, prompt_name, prompt, *args, **kwargs)

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return None
        if name not in self.prompts:  # sentence-transformers encodes without a prompt for a default it lacks
            given = "prompt_name" if prompt_name is not None else "default_prompt_name"
            raise BertkitError(f"{given} {name!r} is not one of this model's prompts {sorted(self.prompts)}; "
                               "pass prompt='...' or add it to prompts")
        return self.prompts[name]


def check_prompt_columns(prompts: Any, parts: list[Any]) -> None:
    """Each key of ``prompts`` names a text column of a dataset (``{column: prompt}``), a dataset
    (``{dataset: ...}``), or, inside a dataset's dict, a text column of that dataset. sentence-transformers leaves
    a prompt for any other name unused (a misspelt column, the label column): the model would train without the
    prompt meant for it and then be used with it. Without a dataset (an evaluator alone) there is nothing to check."""
    if not isinstance(prompts, dict) or not prompts or not parts:
        return
    texts: dict[str | None, set[str]] = {}
    for part in parts:
        texts.setdefault(part.name, set()).update(part.texts)
    by_dataset = isinstance(next(iter(prompts.values())), dict)  # as the collator reads it (``for_dataset``)
    columns = set().union(*texts.values())
    unused = [key for key in prompts if key not in texts and (by_dataset or key not in columns)]
    unused += [f"{key}.{c}" for key, value in prompts.items() if key in texts and isinstance(value, dict)
               for c in value if c not in texts[key]]
    if unused:
        datasets = sorted(n for n in texts if n is not None)
        raise BertkitError(f"prompts names {unused}, no text column" + (" or dataset" if datasets else "") + " of "
                           f"train_dataset or eval_dataset (text columns {sorted(columns)}" + (f", datasets {datasets}"
                           if datasets else "") + "; a label column takes no prompt): sentence-transformers leaves "
                           "such a prompt unused; name the columns the prompts are for")
