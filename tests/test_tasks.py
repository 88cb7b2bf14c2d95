"""A pipeline task is one class (``bertkit.inference.tasks``): the predict commands, serve's --task choices and
routes, ``bertkit.pipeline``'s names and the pipelines' own names all come from ``TASK_LIST``, and a task class
that lacks a piece is refused when it is defined."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from bertkit.errors import BertkitError
from bertkit.inference import serve_tei
from bertkit.inference.serve_wire import PREDICT
from bertkit.inference.tasks import SERVED, TASK_LIST, TASKS, Task


def _sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return dict(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_the_command_line_the_pipelines_and_the_server_list_the_declared_tasks():
    from bertkit.cli import COMMANDS, build_parser
    from bertkit.inference.serve import ROUTES

    names = [t.name for t in TASK_LIST]
    assert names == ["fill-mask", "text-classification", "rerank", "token-classification", "question-answering",
                     "multiple-choice", "feature-extraction", "sentence-embedding", "sparse-embedding"]
    top = _sub(build_parser())
    assert list(_sub(top["predict"])) == ["glue", "ner", "squad", "swag", *names]
    assert [COMMANDS[f"predict {t.name}"].help for t in TASK_LIST] == [
        f"your file (JSONL, CSV/TSV, text) -> JSONL of {t.help}" for t in TASK_LIST]
    task_flag = next(a for a in top["serve"]._actions if a.dest == "task")
    assert task_flag.choices == [t.name for t in SERVED] == [n for n in names if n != "multiple-choice"]
    assert list(TASKS) == [*names, "sentiment-analysis", "ner"]
    assert all(t.pipeline_class().task == t.name for t in TASK_LIST)  # a pipeline's name is its task's
    # serve's routes: those of every server, then each route a served task declares, once
    declared = [r for t in SERVED for r in t.routes]
    assert [r.path for r in ROUTES] == ["/predict", "/", "/rerank", "/similarity", "/v1/embeddings", "/embeddings",
                                       "/embed", "/embed_all", "/embed_sparse", "/tokenize", "/decode", "/info",
                                       "/health", "/ready", "/metrics"]
    assert set(declared) <= set(ROUTES) and all(r.needs for r in declared)
    assert {r for r in ROUTES if r.needs} == set(declared)


def test_serve_refuses_a_task_it_does_not_serve_before_the_model_loads(tmp_path):
    from bertkit.cli import main
    from bertkit.inference.serve import serve
    from bertkit.settings import ServeSettings

    with pytest.raises(SystemExit) as exit_info:  # argparse: not one of the choices
        main(["serve", "--model", str(tmp_path), "--task", "multiple-choice"])
    assert exit_info.value.code == 2
    missing = tmp_path / "no_model"  # nothing is loaded: the refusal comes first
    with pytest.raises(BertkitError, match=r"^bertkit serve does not serve multiple-choice \(no client API"):
        serve(ServeSettings(model_name_or_path=missing, task="multiple-choice"))
    with pytest.raises(BertkitError, match=r"^bertkit serve has no task 'fil-mask'; choose one of fill-mask, "):
        serve(ServeSettings(model_name_or_path=missing, task="fil-mask"))


def test_the_command_line_reads_the_tasks_without_loading_torch():
    loaded = subprocess.run([sys.executable, "-c", "import sys, bertkit.cli; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "False"


@pytest.mark.parametrize("body, message", [
    ({"help": "x", "pipeline": "bertkit.inference.pipelines:FeatureExtractionPipeline"}, "must declare its own name"),
    ({"name": "x", "pipeline": "bertkit.inference.pipelines:FeatureExtractionPipeline"}, "must declare its own help"),
    ({"name": "x", "help": "x"}, "must declare its own pipeline"),
    ({"name": "x", "help": "x", "pipeline": "FeatureExtractionPipeline"}, "must be 'bertkit.module:PipelineClass'"),
    ({"name": "x", "help": "x", "pipeline": "bertkit.p:P", "root": serve_tei.EMBED}, "root route /embed is not one"),
    ({"name": "x", "help": "x", "pipeline": "bertkit.p:P", "routes": (PREDICT,)}, "must say what other servers"),
])
def test_a_task_class_missing_a_piece_is_refused_when_it_is_defined(body, message):
    with pytest.raises(TypeError, match=message):
        type("Broken", (Task,), dict(body))


def test_a_subclass_of_a_task_must_name_itself():
    with pytest.raises(TypeError, match="must declare its own name, help, pipeline"):
        type("Inherited", (type(TASK_LIST[-1]),), {})


def test_the_sparse_embedding_task_is_one_class():
    """What the sparse-embedding task needs of the design: a list of {index, value} per input in predict's files and a
    route of its own that is TEI's POST / on its server, declared in its class alone (no other module names it)."""
    import ast
    from pathlib import Path

    task = TASKS["sparse-embedding"]
    assert task.record(3, [{"index": 2017, "value": 0.5}]) == {"id": 3, "sparse_embedding": [{"index": 2017,
                                                                                              "value": 0.5}]}
    assert task.routes == (task.root,) and task.root.path == "/embed_sparse" and task.root.needs
    assert task.cost(None, "a text", {}, 0) == (1, 0, "inputs")
    src = Path(__file__).resolve().parents[1] / "src" / "bertkit"
    naming = sorted(str(p.relative_to(src)) for p in src.rglob("*.py") if any(
        isinstance(n, ast.Constant) and n.value == "sparse-embedding" for n in ast.walk(ast.parse(p.read_text()))))
    assert naming == ["inference/tasks.py"]
