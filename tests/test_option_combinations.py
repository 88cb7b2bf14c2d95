"""Options that are each tested alone, in combination: a combination one option of which the run would not read is
refused naming both, and combinations of orthogonal options give the numbers of the plainest run (the slow
pairwise draw at the end)."""

from __future__ import annotations

import pytest

from bertkit.cli import COMMANDS, build_parser, build_settings, normalize_argv
from bertkit.errors import BertkitError
from bertkit.settings import TrainingSettings
from bertkit.training.trainer_args import TrainingArguments

GLUE = ["finetune", "glue", "--task", "sst2", "--data-dir", "glue", "--model", "m", "--out", "o"]
PRETRAIN = ["pretrain", "--data", "d", "--vocab", "v", "--out", "o", "--max-steps", "10"]


def _settings(argv: list[str]):
    args = build_parser().parse_args(normalize_argv(argv))
    name = f"{args.command} {args.family}" if "family" in vars(args) else args.command
    return build_settings(COMMANDS[name].settings, args)


@pytest.mark.parametrize(("given", "message"), [
    (["--eval-strategy", "epoch", "--eval-steps", "5"],
     "--eval-steps 5.0 is read only with --eval-strategy steps, but --eval-strategy is epoch: drop --eval-steps, "
     "or pass --eval-strategy steps"),
    (["--eval-strategy", "no", "--eval-steps", "5"], "--eval-steps 5.0 .* but --eval-strategy is no"),
    (["--eval-strategy", "no", "--eval-delay", "2"],
     "--eval-delay 2.0 is read only with --eval-strategy steps or epoch, but --eval-strategy is no"),
    (["--save-strategy", "epoch", "--save-steps", "5"], "--save-steps 5.0 .* but --save-strategy is epoch"),
    (["--save-strategy", "no", "--save-steps", "5"], "--save-steps 5.0 .* but --save-strategy is no"),
    (["--save-strategy", "no", "--save-total-limit", "3"],
     "--save-total-limit 3 is read only with --save-strategy steps or epoch, but --save-strategy is no: drop "
     "--save-total-limit, or pass --save-strategy steps"),
    (["--logging-strategy", "epoch", "--logging-steps", "5"], "--logging-steps 5.0 .* but --logging-strategy is epoch"),
    (["--logging-strategy", "no", "--logging-steps", "5"], "--logging-steps 5.0 .* but --logging-strategy is no"),
])
@pytest.mark.parametrize("command", [GLUE, PRETRAIN], ids=["finetune", "pretrain"])
def test_a_cadence_its_strategy_does_not_read_is_refused_naming_both(command, given, message):
    # each was accepted and dropped: --eval-strategy epoch --eval-steps 5 evaluated once an epoch, and
    # --save-strategy no --save-total-limit 3 kept no checkpoint, both recorded in the run's settings as given
    if command is PRETRAIN and any(g.startswith("--eval-") for g in given):  # pretrain evaluates on --eval-data
        given = [*given, "--eval-data", "e"]
    with pytest.raises(BertkitError, match=message.replace("--", r"\-\-")):
        _settings([*command, *given])


@pytest.mark.parametrize("given", [
    [], ["--eval-steps", "5"], ["--eval-strategy", "steps", "--eval-steps", "5", "--eval-delay", "2"],
    ["--eval-strategy", "epoch", "--eval-delay", "1"], ["--save-strategy", "epoch", "--save-total-limit", "1"],
    ["--save-strategy", "no"], ["--logging-strategy", "epoch"], ["--save-steps", "3", "--save-total-limit", "1"],
])
def test_cadences_their_strategies_read_are_taken(given):
    s = _settings([*GLUE, *given])
    assert (s.eval_strategy, s.save_strategy) == (
        "steps" if "--eval-steps" in given else given[given.index("--eval-strategy") + 1]
        if "--eval-strategy" in given else "epoch",
        given[given.index("--save-strategy") + 1] if "--save-strategy" in given else "steps")


def test_training_arguments_take_them_as_transformers_does(tmp_path):
    # a script written for transformers passes save_steps=500 (its default) with save_strategy="no"
    args = TrainingArguments(output_dir=str(tmp_path), save_strategy="no", save_steps=500, eval_strategy="epoch",
                             eval_steps=7, logging_strategy="epoch", logging_steps=3)
    assert (args.save_steps, args.eval_steps, args.logging_steps) == (500, 7, 3)
    # and the loop's own settings, derived from a command's, are not checked again (pretrain's logging_steps is 10)
    assert TrainingSettings(output_dir=tmp_path, logging_strategy="epoch", logging_steps=10).logging_steps == 10


# -- the pairwise draw: every pair of values of every two fine-tuning options in some run -------------------------


def pairwise(options: dict[str, list], seed: int) -> list[dict]:
    """Rows of option values covering every pair of values of every two options (greedy: each row is the best of
    random candidates seeded with a pair not yet covered)."""
    import itertools
    import random

    rng, names = random.Random(seed), list(options)
    pairs = list(itertools.combinations(range(len(names)), 2))
    uncovered = {(a, i, b, j) for a, b in pairs for i in range(len(options[names[a]]))
                 for j in range(len(options[names[b]]))}
    rows = []
    while uncovered:
        best, best_covered = None, -1
        for _ in range(40):
            idx = [rng.randrange(len(options[n])) for n in names]
            a, i, b, j = rng.choice(sorted(uncovered))
            idx[a], idx[b] = i, j
            covered = sum((x, idx[x], y, idx[y]) in uncovered for x, y in pairs)
            if covered > best_covered:
                best, best_covered = idx, covered
        uncovered -= {(x, best[x], y, best[y]) for x, y in pairs}
        rows.append({n: options[n][k] for n, k in zip(names, best)})
    return rows


@pytest.mark.slow
def test_pairwise_fine_tuning_options_train_alike_and_evaluate_as_asked(tmp_path, tiny_checkpoint):
    """Evaluation, checkpointing and logging cadences never change the training (every logged loss equals the run
    without them, bit for bit), an evaluation strategy is run as recorded (SQuAD's was recorded and never run), and
    report.json's settings name each option given."""
    import json

    from bertkit.cli import main
    from test_token_tasks import CONLL, SPECIALS, _squad_file

    words = {line.split()[0].lower() for text in CONLL.values() for line in text.splitlines() if line.strip()}
    words |= set("the city of was founded in by river people it has bridges when who what is founded ? .".split())
    words |= {f"town{a}" for a in range(6)} | {str(1800 + a) for a in range(6)} | {str(n) for n in range(12)}
    model = tiny_checkpoint(tmp_path / "encoder", tokenizer=SPECIALS + sorted(words))
    conll = tmp_path / "conll"
    conll.mkdir()
    for split, text in CONLL.items():
        (conll / f"{split}.txt").write_text(text)
    squad_file = _squad_file(tmp_path / "dev-v1.1.json")
    tasks = {"ner": ["ner", "--data-dir", str(conll), "--max-seq-length", "32"],
             "squad": ["squad", "--predict-file", str(squad_file), "--max-seq-length", "48", "--doc-stride", "16",
                       "--max-query-length", "12"]}
    options = {"task": ["ner", "squad"], "accum": ["1", "2"], "eval": [["no"], ["steps", "2"], ["epoch"]],
               "save": [["no"], ["steps", "2"], ["epoch"]], "logging": [["steps", "1"], ["epoch"]],
               "limit": [None, "1"]}

    def run(out, d) -> tuple[dict, list[dict]]:
        argv = ["finetune", *tasks[d["task"]], "--model", str(model), "--out", str(out), "--no-progress",
                "--batch-size", "4", "--num-train-epochs", "2", "--learning-rate", "1e-3",
                "--gradient-accumulation-steps", d["accum"], "--eval-strategy", d["eval"][0],
                "--save-strategy", d["save"][0], "--logging-strategy", d["logging"][0]]
        for flag, value in (("--eval-steps", d["eval"][1:]), ("--save-steps", d["save"][1:]),
                            ("--logging-steps", d["logging"][1:])):
            argv += [flag, *value] if value else []
        if d["limit"] and d["save"][0] != "no":
            argv += ["--save-total-limit", d["limit"]]
        assert main(argv) == 0, argv
        return (json.loads((out / "report.json").read_text()),
                [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()])

    plain: dict[tuple, list] = {}
    for k, d in enumerate(pairwise(options, seed=0)):
        report, records = run(tmp_path / f"run{k}", d)
        key = (d["task"], d["accum"])
        if key not in plain:  # the plainest run: no evaluation, no checkpoint, every step logged
            plain[key] = [(r["step"], r["loss"]) for r in run(tmp_path / f"plain{k}", {
                **d, "eval": ["no"], "save": ["no"], "logging": ["steps", "1"], "limit": None})[1]
                if r["split"] == "train"]
        logged = [(r["step"], r["loss"]) for r in records if r["split"] == "train"]
        steps = max(r["step"] for r in records)
        if d["logging"][0] == "steps":
            assert logged == plain[key], d
        else:  # a record at each epoch's end, of that epoch's steps
            assert [step for step, _ in logged] == [steps // 2, steps], d
        evaluated = [r["step"] for r in records if r["split"] == "eval"]
        per_epoch = steps // 2
        assert evaluated == {"no": [], "epoch": [per_epoch, steps],
                             "steps": sorted({*range(2, steps + 1, 2), steps})}[d["eval"][0]], d
        settings = report["settings"]
        assert (settings["eval_strategy"], settings["save_strategy"], settings["logging_strategy"],
                settings["gradient_accumulation_steps"]) == (d["eval"][0], d["save"][0], d["logging"][0],
                                                             int(d["accum"])), d
        if d["limit"] and d["save"][0] != "no":
            assert settings["save_total_limit"] == int(d["limit"]), d
