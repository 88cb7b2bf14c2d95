"""bertkit.sentence name by name against sentence-transformers' public API, enumerated from the installed library
(``__all__`` or ``dir()`` of the top level, ``losses``, ``evaluation``, ``util``, ``models``, ``training_args``,
``cross_encoder`` and ``sparse_encoder`` with theirs), so a name or a default sentence-transformers adds is checked
without editing this file:

- every class and function bertkit has takes sentence-transformers' defaults (a default that differs is a quietly
  different result for every script that leaves it out) and its positional order (``f(x, 16)`` means the same
  argument in both); the few differences kept are listed with what bertkit's default resolves to, and each is
  asserted to still differ, so the list cannot go stale;
- every name bertkit lacks is refused by a BertkitError that names it and says what to use;
- the training arguments' fields read back sentence-transformers' values, or are fields bertkit refuses by name.
Then the cases these checks found, each called as a ported script calls it, against sentence-transformers."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from bertkit.errors import BertkitError

st = pytest.importorskip("sentence_transformers")

SUBMODULES = ("", ".losses", ".evaluation", ".util", ".models", ".training_args", ".cross_encoder",
              ".cross_encoder.losses", ".cross_encoder.evaluation", ".sparse_encoder", ".sparse_encoder.losses",
              ".sparse_encoder.evaluation", ".sparse_encoder.models")

# (module, name, parameter) -> why bertkit's default differs in spelling only: what it resolves to
SAME_WHEN_RESOLVED = {
    **{(m, n, "loss_fct"): "None is nn.MSELoss()" for m, n in ((".losses", "CosineSimilarityLoss"),
                                                                 (".sparse_encoder.losses", "SparseCosineSimilarityLoss"))},
    **{(m, n, "cos_score_transformation"): "None is nn.Identity()"
       for m, n in ((".losses", "CosineSimilarityLoss"), (".sparse_encoder.losses", "SparseCosineSimilarityLoss"))},
    (".losses", "SoftmaxLoss", "loss_fct"): "None is nn.CrossEntropyLoss()",
    (".models", "Pooling", "pooling_mode"): "None is 'mean' (or the legacy pooling_mode_* flags)",
    **{(m, n, "main_distance_function"): "'deprecated' there: the old name of main_similarity_function, unset"
       for m, n in ((".evaluation", "TripletEvaluator"), (".sparse_encoder.evaluation", "SparseTripletEvaluator"))},
    **{(m, n, f): "a default_factory of {} there; None is {}" for m, n in (
        ("", "SentenceTransformerTrainingArguments"), (".training_args", "SentenceTransformerTrainingArguments"),
        ("", "SparseEncoderTrainingArguments"), (".sparse_encoder", "SparseEncoderTrainingArguments"))
       for f in ("router_mapping", "learning_rate_mapping")},
}
# (module, name): ST positional-or-keyword arguments bertkit takes by keyword only (a positional call is Python's
# TypeError naming the count, never another argument's value): the training arguments' hundred fields, the trainers'
# arguments from data_collator on, mine_hard_negatives' from cross_encoder on
KEYWORD_ONLY_HERE = {(m, n) for m in ("", ".training_args", ".cross_encoder", ".sparse_encoder")
                     for n in ("SentenceTransformerTrainingArguments", "CrossEncoderTrainingArguments",
                               "SparseEncoderTrainingArguments", "SentenceTransformerTrainer", "CrossEncoderTrainer",
                               "SparseEncoderTrainer")} | {(".util", "mine_hard_negatives"), ("", "mine_hard_negatives")}


def _modules(sub: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module("sentence_transformers" + sub), importlib.import_module("bertkit.sentence" + sub)


def _public(module) -> list[tuple[str, object]]:
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    return [(n, getattr(module, n)) for n in names if not n.startswith("_")
            and (inspect.isclass(getattr(module, n)) or inspect.isfunction(getattr(module, n)))
            and getattr(getattr(module, n), "__module__", "").startswith("sentence_transformers")]


def _mirror(bk, name):
    """bertkit's object of that name, or the BertkitError that refuses it."""
    try:
        return getattr(bk, name)
    except BertkitError as e:
        return e


def _signature(obj) -> inspect.Signature | None:
    target = obj.__init__ if inspect.isclass(obj) else obj
    if target is object.__init__:
        return None
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def _default(value, owner=None):
    """A default as what it means: a function by its name, an enum by its value, a module by its class, one of the
    reference's distance-metric lambdas by its attribute name, a dataclass factory by what it makes."""
    if value is inspect.Parameter.empty:
        return value
    from sentence_transformers.losses import SiameseDistanceMetric, TripletDistanceMetric

    if inspect.isfunction(value) and value.__name__ == "<lambda>":
        for metric in (SiameseDistanceMetric, TripletDistanceMetric):
            for key, member in vars(metric).items():
                if member is value:
                    return f"{metric.__name__}.{key}"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if inspect.isfunction(value) or inspect.ismethod(value):
        return value.__qualname__
    if isinstance(value, nn.Module):
        return type(value).__name__
    return value


MODEL_CLASSES = (("", "SentenceTransformer"), (".cross_encoder", "CrossEncoder"), (".sparse_encoder", "SparseEncoder"))


def _pairs(methods: bool = False):
    """(module, name, reference's object, bertkit's or its refusal); with ``methods``, also the public methods the
    model classes share (``SentenceTransformer.encode``), named ``Class.method``."""
    for sub in SUBMODULES:
        ref, ours = _modules(sub)
        for name, obj in _public(ref):
            yield sub, name, obj, _mirror(ours, name)
    if methods:
        for sub, cls in MODEL_CLASSES:
            ref, ours = (getattr(m, cls) for m in _modules(sub))
            for name in sorted(n for n in dir(ref) if not n.startswith("_") and n not in dir(nn.Module)):
                theirs = inspect.getattr_static(ref, name)
                mine = inspect.getattr_static(ours, name, None)
                if inspect.isfunction(theirs) and inspect.isfunction(mine):
                    yield sub, f"{cls}.{name}", theirs, mine


def test_every_default_and_position_is_sentence_transformers():
    """Each parameter both libraries have: the same default; each positional one: the same place."""
    differ, seen = [], set()
    for sub, name, ref, ours in _pairs(methods=True):
        if isinstance(ours, BertkitError):
            continue
        theirs, mine = _signature(ref), _signature(ours)
        if theirs is None or mine is None:
            continue
        params = {p.name: p for p in mine.parameters.values()}
        fields = {f.name: f for f in dataclasses.fields(ref)} if dataclasses.is_dataclass(ref) else {}
        for p in theirs.parameters.values():
            if p.name == "self" or p.name not in params:
                continue
            want = p.default
            if p.name in fields and fields[p.name].default_factory is not dataclasses.MISSING:
                want = fields[p.name].default_factory()
            key = (sub, name, p.name)
            # a parameter required there has no default a working script relies on (bertkit's None reaches a
            # refusal that names the argument, e.g. predict(sentences=...))
            if want is not p.empty and _default(want) != _default(params[p.name].default):
                if key in SAME_WHEN_RESOLVED:
                    seen.add(key)
                    continue
                differ.append(f"{sub or '.'}{name}({p.name}=): sentence-transformers {_default(want)!r}, "
                              f"bertkit {_default(params[p.name].default)!r}")
        positional = [p.name for p in theirs.parameters.values() if p.name != "self"
                      and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        ours_positional = [p.name for p in mine.parameters.values() if p.name != "self"
                           and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for i, pname in enumerate(ours_positional):
            if i < len(positional) and positional[i] != pname:
                differ.append(f"{sub or '.'}{name}: positional argument {i} is {positional[i]!r} in "
                              f"sentence-transformers, {pname!r} in bertkit")
                break
        forwarded = any(p.kind is p.VAR_POSITIONAL for p in mine.parameters.values())  # encode_query's *args
        dropped = [n for n in positional[len(ours_positional):] if n in params]
        if dropped and not forwarded and (sub, name) not in KEYWORD_ONLY_HERE:
            differ.append(f"{sub or '.'}{name}: {dropped} are positional in sentence-transformers, keyword-only here")
    assert not differ, "\n".join(differ)
    assert seen == set(SAME_WHEN_RESOLVED), f"no longer different (drop them): {set(SAME_WHEN_RESOLVED) - seen}"


def test_every_absent_name_is_refused_naming_what_to_use():
    """``from bertkit.sentence import X`` for each X sentence-transformers exports and bertkit lacks: a BertkitError
    naming X and a fix, never Python's bare AttributeError or "cannot import name"."""
    bare = []
    for sub, name, _, ours in _pairs():
        _, module = _modules(sub)
        if isinstance(ours, BertkitError):
            assert name in str(ours) and "is not implemented in bertkit: " in str(ours), str(ours)
            with pytest.raises(BertkitError, match=name):
                exec(f"from {module.__name__} import {name}", {})
    for sub in SUBMODULES:
        ref, ours = _modules(sub)
        for name, _ in _public(ref):
            try:
                getattr(ours, name)
            except BertkitError:
                pass
            except AttributeError as e:
                bare.append(f"bertkit.sentence{sub}.{name}: {e}")
    assert not bare, "\n".join(bare)


# the training arguments' fields whose value reads otherwise, and why that changes nothing
ARGS_READ_OTHERWISE = {
    "output_dir": "a Path of the same directory",
    "report_to": "'none' for transformers' [] (nowhere)",
    "lr_scheduler_kwargs": "{} for None (no options)",
    "gradient_checkpointing": "None for False (off)",
    "disable_tqdm": "None for False (transformers resolves None from the log level)",
    "dataloader_num_workers": "None: 0 on the CPU, workers on CUDA (docs/coming-from-transformers.md)",
    "prediction_loss_only": "False for True: the sentence trainers evaluate the loss and the evaluator either way",
}


@pytest.mark.parametrize("names", [("SentenceTransformerTrainingArguments", ""),
                                   ("CrossEncoderTrainingArguments", ".cross_encoder"),
                                   ("SparseEncoderTrainingArguments", ".sparse_encoder")], ids=lambda n: n[0])
def test_training_arguments_read_back_sentence_transformers_defaults(names, tmp_path):
    from bertkit.training.trainer_args import REFUSED

    name, sub = names
    ref_module, ours_module = _modules(sub)
    theirs = getattr(ref_module, name)(output_dir=str(tmp_path))
    ours = getattr(ours_module, name)(output_dir=str(tmp_path))
    differ, absent = [], []
    for field in dataclasses.fields(theirs):
        if not field.init or field.name in ARGS_READ_OTHERWISE:
            continue
        if not hasattr(ours, field.name):
            absent.append(field.name)
            continue
        want, got = (getattr(getattr(x, field.name), "value", getattr(x, field.name)) for x in (theirs, ours))
        if want != got:  # transformers' str enums (IntervalStrategy.STEPS) as their values
            differ.append(f"{field.name}: sentence-transformers {want!r}, bertkit {got!r}")
    assert not differ, "\n".join(differ)
    assert not [n for n in absent if n not in REFUSED], "fields neither implemented nor refused by name"


# -- what the enumeration found, called as a script calls it ----------------------------------------------------------


@pytest.fixture(scope="module")
def cross_encoders(minilm_2_layers, tmp_path_factory):
    from sentence_transformers.cross_encoder import CrossEncoder as Reference

    from bertkit.sentence.cross_encoder import CrossEncoder
    from cross_encoder_helpers import cross_encoder_directory

    path = cross_encoder_directory(minilm_2_layers, tmp_path_factory.mktemp("ce"))
    return CrossEncoder(str(path), device="cpu"), Reference(str(path), device="cpu"), path


PAIRS = [("Where is Paris?", "Paris is in France."), ("Who wrote it?", "Nobody knows."), ("x", "")]


def test_cross_encoder_predict_and_rank_take_arguments_at_sentence_transformers_6_positions(cross_encoders):
    """Was: predict(pairs, None, None, 2) failed on batch_size None, and predict(pairs, 2), which
    sentence-transformers 6 reads as prompt_name 2, scored in batches of 2."""
    ours, ref, _ = cross_encoders
    np.testing.assert_allclose(ours.predict(PAIRS, None, None, 2, False, nn.Identity()),
                               ref.predict(PAIRS, None, None, 2, False, nn.Identity()), atol=1e-5, rtol=0)
    docs = [b for _, b in PAIRS]
    got, want = ours.rank("q", docs, 2, True, None, None, 1), ref.rank("q", docs, 2, True, None, None, 1)
    assert [(r["corpus_id"], r["text"]) for r in got] == [(r["corpus_id"], r["text"]) for r in want]
    for call in (lambda m: m.predict(PAIRS, 16), lambda m: m.rank("q", docs, 1, False, 16)):
        with pytest.raises(BertkitError, match=r"prompt_name=16\).*not batch_size: pass batch_size=16"):
            call(ours)
    with pytest.raises(BertkitError, match=r"prompt_name=\.\.\.\) is not implemented in bertkit: prompts"):
        ours.predict(PAIRS, "query")


def test_cross_encoder_reranking_evaluator_takes_prompt_name_after_name(cross_encoders):
    """Was: (samples, 10, True, "dev", None, 2) failed on batch_size None."""
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator as Reference

    from bertkit.sentence.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    ours, ref, _ = cross_encoders
    samples = [{"query": "Where is Paris?", "positive": ["Paris is in France."], "negative": ["Nobody knows.", "x"]}]
    got = CrossEncoderRerankingEvaluator(samples, 2, True, "dev", None, 2, False, False)(ours)
    want = Reference(samples, 2, True, "dev", None, 2, False, False)(ref)
    assert got == pytest.approx(want, abs=1e-6)
    with pytest.raises(BertkitError, match=r"prompt_name=2\).*not batch_size: pass batch_size=2"):
        CrossEncoderRerankingEvaluator(samples, 2, True, "dev", 2)


def test_cross_encoder_modules_and_no_path_are_refused_by_name():
    """Was: Python's "missing 1 required positional argument: 'model_name_or_path'"."""
    from bertkit.sentence.cross_encoder import CrossEncoder

    with pytest.raises(BertkitError, match=r"CrossEncoder\(modules=\.\.\.\) is not implemented in bertkit: build"):
        CrossEncoder(modules=[nn.Identity()])
    with pytest.raises(BertkitError, match="CrossEncoder takes the path of a local directory"):
        CrossEncoder()


def test_local_files_only_false_sentence_transformers_default_loads_a_local_directory(minilm_2_layers,
                                                                                      cross_encoders, tmp_path):
    """Was: local_files_only=False (sentence-transformers' default, which a script passes through) was refused with
    a local directory, where it changes nothing; its default here was True."""
    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.cross_encoder import CrossEncoder
    from sentence_helpers import st_directory

    path = st_directory(minilm_2_layers, tmp_path / "st")
    texts = ["A man is eating food.", "héllo"]
    want = st.SentenceTransformer(str(path), device="cpu", local_files_only=False).encode(texts)
    for flag in (False, True):
        np.testing.assert_allclose(SentenceTransformer(path, local_files_only=flag).encode(texts), want, atol=1e-5,
                                   rtol=0)
    _, ref, ce_path = cross_encoders
    again = CrossEncoder(ce_path, device="cpu", local_files_only=False)
    np.testing.assert_allclose(again.predict(PAIRS), ref.predict(PAIRS), atol=1e-5, rtol=0)
    with pytest.raises(BertkitError, match=r"local_files_only='no'\) takes True or False"):
        SentenceTransformer(path, local_files_only="no")
    with pytest.raises(BertkitError, match=r"use_auth_token=\.\.\.\) is not implemented in bertkit: bertkit loads"):
        SentenceTransformer(path, use_auth_token="hf_x")


def test_sparse_transformer_default_task_is_sentence_transformers_and_refused(minilm_2_layers, tmp_path):
    """Was: sparse_encoder.models.Transformer(path) defaulted to fill-mask: the script that gives 384 dense weights
    per text in sentence-transformers (its default, feature-extraction, under SpladePooling) gave 8,960 SPLADE
    weights here."""
    from sentence_transformers.sparse_encoder import SparseEncoder as Reference
    from sentence_transformers.sparse_encoder import models as ref_models

    from bertkit.sentence.sparse_encoder import SparseEncoder, models
    from sparse_helpers import masked_lm_checkpoint

    path = masked_lm_checkpoint(minilm_2_layers, tmp_path / "mlm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = Reference(modules=[ref_models.Transformer(str(path)), ref_models.SpladePooling("max")], device="cpu")
    assert ref.encode(["hello world"], convert_to_tensor=True).shape == (1, 384)
    with pytest.raises(BertkitError, match=r"transformer_task='feature-extraction'\) \(sentence-transformers' "
                                           r"default\).*pass transformer_task='fill-mask' \(or use MLMTransformer"):
        models.Transformer(path)
    texts = ["hello world", "The weather is lovely today."]
    for word, ref_word in ((models.Transformer(path, transformer_task="fill-mask"),
                            ref_models.Transformer(str(path), transformer_task="fill-mask")),
                           (models.MLMTransformer(path), ref_models.MLMTransformer(str(path)))):
        ours = SparseEncoder(modules=[word, models.SpladePooling("max")], device="cpu")
        ref = Reference(modules=[ref_word, ref_models.SpladePooling("max")], device="cpu")
        got, want = (m.encode(texts, convert_to_tensor=True).to_dense() for m in (ours, ref))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_pairwise_angle_sim_takes_sentence_transformers_names():
    """Was: pairwise_angle_sim(x=..., y=...) was Python's "unexpected keyword argument 'x'"."""
    from sentence_transformers import util as ref

    from bertkit.sentence import util

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    torch.testing.assert_close(util.pairwise_angle_sim(x=x, y=y), ref.pairwise_angle_sim(x=x, y=y), atol=1e-6,
                               rtol=0)


def test_mine_hard_negatives_is_exported_at_the_top_as_there():
    import bertkit.sentence
    from bertkit.sentence import util

    assert bertkit.sentence.mine_hard_negatives is util.mine_hard_negatives


def test_encode_query_and_document_take_encodes_arguments_by_position(minilm_2_layers, tmp_path):
    """Was: encode_document(texts, None, None, 2, ...) was Python's "takes from 1 to 4 positional arguments" (found
    by tests/test_sentence_surface_fuzz.py)."""
    from bertkit.sentence import SentenceTransformer
    from sentence_helpers import st_directory

    path = st_directory(minilm_2_layers, tmp_path / "st", normalize=False)
    prompts = {"query": "query: ", "document": "passage: "}
    ours = SentenceTransformer(path, prompts=prompts)
    ref = st.SentenceTransformer(str(path), device="cpu", prompts=prompts)
    texts = ["A man is eating food.", "héllo", ""]
    # batch_size, show_progress_bar, output_value, precision, convert_to_numpy, convert_to_tensor, device,
    # normalize_embeddings, truncate_dim
    rest = (2, False, "sentence_embedding", "float32", True, False, None, True, 16)
    for method in ("encode_query", "encode_document"):
        got, want = (getattr(m, method)(texts, None, None, *rest) for m in (ours, ref))
        assert got.shape == (3, 16)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_model_attributes_are_sentence_transformers_or_refused_by_name(minilm_2_layers, cross_encoders, tmp_path):
    """Each public attribute of sentence-transformers' three model classes (beyond nn.Module's), read on bertkit's
    model: sentence-transformers' value where bertkit has it, else a BertkitError naming it and what to use. Was:
    17 names (get_backend, model_type, modalities, supports, processor, pop, merge, SUPPORTED_SIMILARITY_FN_NAMES,
    ...) were Python's bare AttributeError."""
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    from bertkit.sentence import SentenceTransformer
    from bertkit.sentence.sparse_encoder import SparseEncoder

    st.SparseEncoder(modules=[MLMTransformer(str(minilm_2_layers)), SpladePooling("max")], device="cpu").save(
        str(tmp_path / "splade"))  # with its masked-LM head
    models = [(SentenceTransformer(str(minilm_2_layers), device="cpu"),
               st.SentenceTransformer(str(minilm_2_layers), device="cpu")), cross_encoders[:2],
              (SparseEncoder(str(tmp_path / "splade"), device="cpu"),
               st.SparseEncoder(str(tmp_path / "splade"), device="cpu"))]
    bare = []
    for ours, ref in models:
        what = type(ours).__name__
        for name in sorted(n for n in dir(type(ref)) if not n.startswith("_") and n not in dir(nn.Module)):
            try:
                getattr(ours, name)
            except BertkitError as e:
                assert f"{what}.{name} is not implemented in bertkit: " in str(e), str(e)
            except AttributeError as e:
                bare.append(f"{what}.{name}: {e}")
        for name in ("model_type", "default_huggingface_organization", "modalities", "SUPPORTED_SIMILARITY_FN_NAMES"):
            assert getattr(ours, name, None) == getattr(ref, name, None), (what, name)
        assert (ours.get_backend(), ours.supports("text"), ours.supports(("image", "text")), ours.supports("image"),
                sorted(ours.get_model_kwargs())) == (ref.get_backend(), ref.supports("text"),
                                                     ref.supports(("image", "text")), ref.supports("image"),
                                                     sorted(ref.get_model_kwargs()))
        assert ours.processor is ours.tokenizer
        with pytest.raises(BertkitError, match=rf"{what}\.merge is not implemented in bertkit: .*mergekit"):
            type(ours).merge([ours, ours])
    assert not bare, "\n".join(bare)
    ce = cross_encoders[0]
    assert (ce.get_max_seq_length(), type(ce.default_activation_function)) == (ce.max_length, nn.Sigmoid)
    with pytest.raises(BertkitError, match=r"CrossEncoder\.pop is not implemented in bertkit: bertkit's CrossEncoder"):
        ce.pop(0)
    assert isinstance(SentenceTransformer.load(str(minilm_2_layers)), SentenceTransformer)


def test_sentence_transformers_6_3_model_additions_are_followed_or_refused(minilm_2_layers, cross_encoders,
                                                                          tmp_path):
    """sentence-transformers 6.3's additions to its model classes and training arguments: activation_checkpointing_enable
    (gradient_checkpointing_enable its older name) turns on the encoder's recomputation, get_device_name answers the
    device a model goes to without device=, activation_checkpointing is the training arguments' name of
    gradient_checkpointing (the newer winning); use_kernels and kernel_config, transformers' Hub kernels, are refused
    by name (use_kernels=False, their default, loads). Was: AttributeError, an unknown argument, a refusal saying
    to use gradient_checkpointing."""
    from bertkit.sentence import SentenceTransformer, SentenceTransformerTrainingArguments

    ours, ref = SentenceTransformer(str(minilm_2_layers), use_kernels=False), cross_encoders[0]
    for model in (ours, ref):
        encoders = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
        assert encoders and not any(m.gradient_checkpointing for m in encoders)
        model.activation_checkpointing_enable({"use_reentrant": False})
        assert all(m.gradient_checkpointing for m in encoders)
        model.gradient_checkpointing_enable()
        assert model.get_device_name() == ("cuda:0" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert ours.get_device_name() == st.SentenceTransformer(str(minilm_2_layers), device="cpu").get_device_name()
    for name, value in (("use_kernels", True), ("kernel_config", {"layers": {}})):
        with pytest.raises(BertkitError, match=rf"^SentenceTransformer\({name}=...\) is not implemented in bertkit: "
                                               r"bertkit runs its own PyTorch encoder, .* drop this argument$"):
            SentenceTransformer(str(minilm_2_layers), **{name: value})
    for kwargs, want in (({"activation_checkpointing": True}, True), ({"gradient_checkpointing": True}, True),
                         ({"activation_checkpointing": False, "gradient_checkpointing": True}, False), ({}, False)):
        args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path), **kwargs)
        theirs = st.SentenceTransformerTrainingArguments(output_dir=str(tmp_path), **kwargs)
        assert (args.activation_checkpointing, bool(args.gradient_checkpointing)) == \
            (theirs.activation_checkpointing, theirs.gradient_checkpointing) == (want, want), kwargs
    with pytest.raises(BertkitError, match=r"activation_checkpointing_kwargs=\{'use_reentrant': True\} is a "
                                           r"transformers argument bertkit does not implement: use "
                                           r"gradient_checkpointing=True \(per encoder layer, no options\)"):
        SentenceTransformerTrainingArguments(output_dir=str(tmp_path),
                                             activation_checkpointing_kwargs={"use_reentrant": True})
