"""No transformers field or keyword falls through: each of transformers' live ``TrainingArguments`` fields (read from
the installed transformers, so a field it adds later is met here) is one bertkit implements, one it refuses by name
(``REFUSED``, accepted at transformers' default) or one bertkit keeps documented; given to the constructor or
assigned afterwards, as transformers' scripts assign them (``args.optim = "sgd"``), a value is honoured or refused,
never kept as an attribute nothing reads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import bertkit
from bertkit.errors import BertkitError
from bertkit.training.trainer_args import REFUSED

transformers = pytest.importorskip("transformers")

THEIRS = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments) if f.init}
OURS = {f.name for f in dataclasses.fields(bertkit.TrainingArguments) if f.init}


def _args(tmp_path, **kwargs):
    return bertkit.TrainingArguments(output_dir=str(tmp_path / "out"), **kwargs)


@pytest.mark.parametrize("name", sorted(THEIRS))
def test_each_transformers_field_is_implemented_refused_or_documented(name, tmp_path):
    """Every field: implemented (a bertkit field, named in the docs' list) or refused by name unless at transformers'
    default, both as a constructor argument and assigned after construction (which kept any value, an unimplemented
    field's included, as a plain attribute that nothing read: ``args.neftune_noise_alpha = 5.0`` trained without
    noise, ``args.push_to_hub = True`` pushed nothing)."""
    listed = (Path(__file__).parents[1] / "docs/coming-from-transformers.md").read_text(encoding="utf-8")
    assert (name in OURS) != (name in REFUSED), f"{name}: neither implemented nor refused (or both)"
    if name in OURS:
        assert re.search(rf"`{name}[`=]", listed), f"{name} is implemented but coming-from-transformers.md omits it"
        args = _args(tmp_path)
        setattr(args, name, getattr(args, name))  # its own value: accepted, and still a field
        assert name not in args.__dict__ or name in {f.name for f in dataclasses.fields(args)}
        return
    sentinel = object()  # no transformers default equals it
    with pytest.raises(BertkitError, match=rf"{name}=<object .*> is a transformers argument bertkit does not"):
        _args(tmp_path, **{name: sentinel})
    args = _args(tmp_path)
    with pytest.raises(BertkitError, match=rf"{name}=<object .*> is a transformers argument bertkit does not"):
        setattr(args, name, sentinel)
    assert not hasattr(args, name)
    default = THEIRS[name].default
    if default is not dataclasses.MISSING:
        setattr(args, name, default)  # transformers' own default changes nothing, so it is taken
        assert not hasattr(args, name)


def test_an_assignment_after_construction_is_built_as_the_constructor_builds_it(tmp_path):
    """transformers' scripts assign fields after parsing; bertkit derived the device, the progress bar and the
    schedule's options once, in the constructor, and kept later values unchecked: ``args.optim = "sgd"`` trained AdamW,
    ``args.save_strategy = "best"`` saved at the end only, ``args.disable_tqdm = True`` still drew the bar,
    ``args.lr_scheduler_kwargs = '{"num_cycles": 2}'`` failed in the loop with an AttributeError, and a typo
    (``args.learning_rte``) was a new attribute."""
    args = _args(tmp_path, use_cpu=True)
    args.disable_tqdm = True
    assert args.progress is False
    args.lr_scheduler_type = "cosine"
    args.lr_scheduler_kwargs = '{"num_cycles": 2}'
    assert args.lr_scheduler_kwargs == {"num_cycles": 2}
    args.learning_rate = 3e-4
    assert args.learning_rate == 3e-4 and args.progress is False and args.lr_scheduler_type == "cosine"
    for name, value, message in (
            ("optim", "sgd", "optim 'sgd' is not implemented in bertkit"),
            ("save_strategy", "best", "save_strategy 'best' .* is not implemented: set save_strategy to "
                                      "eval_strategy's value with load_best_model_at_end=True"),
            ("learning_rte", 1e-4, "unknown argument 'learning_rte'; did you mean learning_rate"),
            ("learning_rate", -1.0, "learning_rate must be a finite positive number, got -1.0"),
            ("lr_scheduler_kwargs", {"power": 2}, "power"),
            ("device", "cuda", "TrainingArguments.device is decided from the other fields: set use_cpu instead"),
            ("progress", True, "set disable_tqdm instead")):
        before = dict(args.__dict__)
        with pytest.raises(BertkitError, match=message):
            setattr(args, name, value)
        assert args.__dict__ == before, name  # a refused assignment changes nothing
    args.eval_strategy = "epoch"
    assert args.do_eval is True


@pytest.mark.parametrize("strategy", ["no", "steps", "epoch"])
def test_do_eval_is_derived_as_transformers_derives_it(strategy, tmp_path):
    """transformers sets do_eval when eval_strategy is not "no", and its example scripts run their final evaluation
    (and write eval_results.json) `if training_args.do_eval`: bertkit left it False, so a ported script skipped it."""
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), eval_strategy=strategy, report_to="none")
    ours = _args(tmp_path, eval_strategy=strategy)
    assert ours.do_eval is theirs.do_eval is (strategy != "no")


@pytest.mark.parametrize("given", [{}, {"logging_steps": 7}, {"logging_steps": 0.25}, {"eval_steps": 3}])
def test_eval_steps_is_derived_as_transformers_derives_it(given, tmp_path):
    """eval_strategy "steps" without eval_steps evaluates every logging_steps, and transformers writes that into
    args.eval_steps (callbacks and scripts read it); bertkit evaluated at the same steps but left it None."""
    for strategy in ("steps", "epoch"):
        theirs = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), eval_strategy=strategy,
                                                report_to="none", **given)
        ours = _args(tmp_path, eval_strategy=strategy, **given)
        assert ours.eval_steps == theirs.eval_steps, (strategy, ours.eval_steps, theirs.eval_steps)


def test_sentence_arguments_keep_their_own_fields_through_an_assignment(tmp_path):
    from bertkit.sentence import SentenceTransformerTrainingArguments

    args = SentenceTransformerTrainingArguments(output_dir=str(tmp_path / "st"), batch_sampler="no_duplicates",
                                                prompts={"anchor": "query: "})
    args.learning_rate = 1e-3
    assert (args.learning_rate, args.batch_sampler.value, args.prompts) == (1e-3, "no_duplicates",
                                                                            {"anchor": "query: "})


def test_batch_eval_metrics_refuses_a_compute_metrics_without_compute_result(tmp_path, minilm_2_layers):
    """batch_eval_metrics=True with a compute_metrics(p) of one argument: bertkit ran the whole evaluation, then failed
    inside the user's function with a bare TypeError ("got an unexpected keyword argument 'compute_result'");
    transformers refuses it first. Now it is refused before the model runs, naming the function and the fix."""
    from trainer_helpers import TEST, accuracy, tiny_classifier

    checkpoint = tiny_classifier(tmp_path / "tiny", minilm_2_layers)
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TEST]
    trainer = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                              args=_args(tmp_path, use_cpu=True, batch_eval_metrics=True, report_to="none"),
                              eval_dataset=rows, processing_class=tokenizer, compute_metrics=accuracy)
    with pytest.raises(BertkitError, match=r"accuracy\(eval_pred\) takes none: add `compute_result=False`"):
        trainer.evaluate()

    def batched(p, compute_result=False):
        return {"rows": len(p.label_ids)} if compute_result else None

    trainer.compute_metrics = batched
    assert trainer.evaluate()["eval_rows"] == len(TEST) - 8 == 5  # the last batch's rows (batches of 8)


def _keywords(function) -> dict[str, object]:
    """transformers' keywords of ``function`` (its live signature) with their defaults, past the directory."""
    import inspect

    return {p.name: p.default for p in list(inspect.signature(function).parameters.values())[2:]
            if p.kind is p.POSITIONAL_OR_KEYWORD}


def test_save_pretrained_takes_each_transformers_keyword_at_its_default_and_refuses_others(tmp_path, minilm_dir):
    """model.save_pretrained(d, max_shard_size="10MB") (or is_main_process=False, state_dict=..., push_to_hub=True),
    tokenizer.save_pretrained(d, legacy_format=False): a bare TypeError, naming the keyword and no way on, and at
    transformers' own default too (a script passing its defaults through stopped). Now each keyword of transformers'
    live signature is taken at its default (the same files) and refused by name with what to do otherwise."""
    from bertkit.checkpoint_io import SAVE_OPTIONS as MODEL_OPTIONS
    from bertkit.tokenization.tokenizer import SAVE_OPTIONS as TOKENIZER_OPTIONS

    config = bertkit.BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16)
    model = bertkit.BertModel(config)
    tokenizer = bertkit.AutoTokenizer.from_pretrained(minilm_dir)
    for saver, reference, table in ((model.save_pretrained, transformers.BertModel.save_pretrained, MODEL_OPTIONS),
                                    (tokenizer.save_pretrained, transformers.BertTokenizerFast.save_pretrained,
                                     TOKENIZER_OPTIONS)):
        theirs = _keywords(reference)
        assert set(theirs) <= set(table), set(theirs) - set(table)
        assert all(table[k][0] == v for k, v in theirs.items()), {k: (table[k][0], v) for k, v in theirs.items()}
        plain = tmp_path / f"{type(saver.__self__).__name__}-plain"
        given = tmp_path / f"{type(saver.__self__).__name__}-defaults"
        saver(plain)
        saver(given, **theirs)
        assert {p.name: p.read_bytes() for p in given.iterdir()} == {p.name: p.read_bytes() for p in plain.iterdir()}
        for name, default in theirs.items():
            other = object() if default is None else (not default if isinstance(default, bool) else "10MB")
            with pytest.raises(BertkitError, match=rf"save_pretrained\({name}=.*\) is not implemented in bertkit "
                                                   rf"\(only {name}={default!r}, transformers' default\): \w+"):
                saver(tmp_path / "refused", **{name: other})
            assert not (tmp_path / "refused").exists()
        with pytest.raises(BertkitError, match="save_pretrained got an unknown argument 'safe_serialisation'"):
            saver(tmp_path / "refused", safe_serialisation=True)


def test_push_to_hub_of_models_tokenizer_and_config_is_refused_naming_the_upload(minilm_dir):
    """model.push_to_hub("me/model") (a head's, the tokenizer's, the config's, as transformers has them) stopped in a
    bare AttributeError naming nothing; each is refused with how to upload the saved directory, what
    save_pretrained(push_to_hub=True) says."""
    config = bertkit.BertConfig(vocab_size=99, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=16)
    owners = [bertkit.BertModel(config), bertkit.BertForSequenceClassification(config), bertkit.BertForMaskedLM(config),
              bertkit.AutoTokenizer.from_pretrained(minilm_dir), config]
    for owner in owners:
        assert callable(getattr(transformers, type(owner).__name__).push_to_hub)  # transformers' classes have it
        with pytest.raises(BertkitError, match=rf"^{type(owner).__name__}\.push_to_hub is not implemented in bertkit "
                                               r"\(it reaches no hub\): save with \.save_pretrained\(DIR\), then "
                                               r"upload DIR with huggingface_hub \(HfApi\(\)\.upload_folder"):
            owner.push_to_hub("me/model", commit_message="trained")


@pytest.mark.parametrize("method", ["__init__", "train", "evaluate", "predict"])
def test_each_trainer_keyword_is_taken_or_refused_by_name(method, tmp_path, minilm_2_layers):
    """Each keyword of transformers' live Trainer signatures is a bertkit parameter, or refused by name unless given
    at transformers' default (``train(trial=None)``, a script's default passed through, was refused)."""
    import inspect

    from bertkit.training.trainer import NOT_IMPLEMENTED_ARGUMENTS
    from trainer_helpers import TEST, tiny_classifier

    ours = inspect.signature(getattr(bertkit.Trainer, method)).parameters
    theirs = {n: p.default for n, p in inspect.signature(getattr(transformers.Trainer, method)).parameters.items()
              if n != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}
    missing = {n: d for n, d in theirs.items() if n not in ours}
    if method == "__init__":
        assert set(missing) == set(NOT_IMPLEMENTED_ARGUMENTS), missing
        return
    checkpoint = tiny_classifier(tmp_path / "tiny", minilm_2_layers)
    tokenizer = bertkit.AutoTokenizer.from_pretrained(checkpoint)
    rows = [{**tokenizer(r["text"]), "label": r["label"]} for r in TEST]
    trainer = bertkit.Trainer(model=bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint),
                              args=_args(tmp_path, use_cpu=True, max_steps=1, report_to="none"),
                              train_dataset=rows, eval_dataset=rows, processing_class=tokenizer)
    call = getattr(trainer, method)
    data = {"predict": (rows,)}.get(method, ())
    for name, default in missing.items():
        with pytest.raises(BertkitError, match=rf"{name}"):
            call(*data, **{name: object()})
        call(*data, **{name: default})  # transformers' default: taken


@pytest.mark.parametrize("switch", ["is_decoder", "add_cross_attention"])
def test_decoder_switches_assigned_on_a_loaded_config_are_refused(switch, tmp_path, minilm_2_layers):
    """``model.config.is_decoder = True`` after loading: transformers' attention reads it at each call and turns causal
    (other logits), where bertkit kept it as an attribute nothing read, its outputs still bidirectional. config.json's
    is_decoder was refused already; the assignment is now refused the same way and the config left as it was."""
    from trainer_helpers import tiny_classifier

    checkpoint = tiny_classifier(tmp_path / "tiny", minilm_2_layers)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    ids = transformers.AutoTokenizer.from_pretrained(checkpoint)(["a good movie", "bad"], padding=True,
                                                                  return_tensors="pt")  # (its mask reads the switch)
    before = theirs(**ids).logits
    theirs.config.is_decoder = True
    assert (theirs(**ids).logits - before).abs().max() > 1e-4  # the reference does change its numbers
    model = bertkit.AutoModelForSequenceClassification.from_pretrained(checkpoint)
    with pytest.raises(BertkitError, match=rf"{switch}=true: BERT as a decoder .* is not implemented"):
        setattr(model.config, switch, True)
    assert getattr(model.config, switch, False) is False  # config.json's false (read as transformers reads it), kept
    setattr(model.config, switch, False)  # what bertkit computes: taken


def test_split_special_tokens_assigned_is_refused_where_transformers_splits(minilm_dir):
    """``tok.split_special_tokens = True``: transformers then reads "[MASK]" in a text as "[", "mask", "]" (ids 1031,
    7308, 1033), where bertkit kept the attribute, read it nowhere and gave 103. Now refused by name; False (the
    default, what bertkit does) is taken and reads as transformers'."""
    text = "isn't [MASK] it"
    theirs = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    theirs.split_special_tokens = True
    assert theirs(text)["input_ids"][4:7] == [1031, 7308, 1033]
    ours = bertkit.AutoTokenizer.from_pretrained(minilm_dir)
    assert ours.split_special_tokens is False
    with pytest.raises(BertkitError, match=r"tok.split_special_tokens = True is not implemented in bertkit"):
        ours.split_special_tokens = True
    ours.split_special_tokens = False
    assert ours(text)["input_ids"] == transformers.AutoTokenizer.from_pretrained(minilm_dir)(text)["input_ids"]
