"""The house reads top-down: cli -> recipes (training/, inference/, features) -> tasks/data -> heads ->
modeling -> padding/tokenization -> config, with no import pointing up and no cycle.

Every import counts: at module level or inside a function, under ``TYPE_CHECKING``, relative, and the
names a package hands out lazily (``from bertkit import BertModel`` is an edge to bertkit.modeling, through
``bertkit/__init__.py``'s ``_EXPORTS`` table). Every module must sit in a layer, so a new one is placed on
purpose.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bertkit"

# Lower numbers are higher in the house; a module may import its own layer or any layer below. The first name of
# each layer is the one CONTRIBUTING.md names; the others are what sits beside it. training/distributed.py (process groups, rank
# and device of this process) is part of the recipes: the core never knows it runs under torchrun. settings/ (every
# command's settings) sits beside the recipes that take it, but is plain data: it imports none of them, nor torch
# (test_settings_are_plain_data below); a device or a server's limits are decided by the command that runs.
LAYERS = [
    ("cli", "__main__", "demo", "cli_flags"),
    ("training", "inference", "features", "feature_files", "settings", "sentence"),
    ("tasks", "data", "auto"),
    ("heads", "head_losses", "quantization"),
    ("modeling",),
    ("padding", "tokenization", "checkpoint_io", "checkpoint_keys", "checkpoint_checks", "weight_files", "model_checks"),
    ("config", "outputs", "manifests", "staging", "dir_swap", "job_writes", "write_paths", "runs", "partial_output", "dir_lock", "errors", "_parallel", "_hardware", "examples", "hub", "compat", "calibration_text",
     "construction", "progress"),
]


def _layer(module: str) -> int:
    top = module.split(".")[1] if module.count(".") >= 1 else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def _module_names() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC.parent).with_suffix("")
        out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """A package's ``_EXPORTS = {"Name": "bertkit.module"}`` table (PEP 562 lazy public names)."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(node.value.keys, node.value.values)}
    return {}


@functools.cache  # parsed once: the tests only read the edges
def _modules() -> dict[str, set[str]]:
    names = _module_names()
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in names.items()}
    exports = {name: _lazy_exports(tree) for name, tree in trees.items()}

    def resolve(package: str, imported: str) -> str:
        """``from package import imported``: the submodule, the module a lazy name comes from, or the package."""
        if f"{package}.{imported}" in names:
            return f"{package}.{imported}"
        return exports.get(package, {}).get(imported, package)

    edges = {}
    for name, tree in trees.items():
        is_package = names[name].name == "__init__.py"
        deps = set(exports[name].values())  # a package's lazy names are imports it makes on first use
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from .x import y, from .. import z
                    base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if module.startswith("bertkit"):
                    deps |= {resolve(module, a.name) for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("bertkit")}
        edges[name] = {d for d in deps if d not in ("bertkit", name)}
    return edges


def test_every_module_sits_in_a_layer():
    for module in _module_names():
        if module != "bertkit":
            _layer(module)
    # the recipes' modules that one might expect elsewhere
    recipes = LAYERS.index(("training", "inference", "features", "feature_files", "settings", "sentence"))
    for module in ("bertkit.training.distributed", "bertkit.features", "bertkit.inference.pipelines",
                   "bertkit.inference.export", "bertkit.training.feature_study"):
        assert _layer(module) == recipes, module


def test_lazy_public_names_count_as_imports():
    edges = _modules()
    assert "bertkit.heads" in edges["bertkit.demo"]  # `from bertkit import BertForSequenceClassification` in a function
    assert "bertkit.data.pretraining" in edges["bertkit.data"]  # data/__init__.py's lazy table


def test_no_import_points_up():
    upward = []
    for module, deps in _modules().items():
        if module == "bertkit":
            continue  # the package's public names come from every layer, on first use
        for dep in deps:
            if _layer(dep) < _layer(module):
                upward.append(f"{module} -> {dep}")
    assert not upward, "imports pointing up the house: " + ", ".join(sorted(upward))


def test_the_core_does_not_import_recipes_or_the_command_line():
    """CONTRIBUTING.md, "The import rule": the core never imports training/, tasks/, data/, inference/ or cli."""
    core = ("bertkit.modeling", "bertkit.heads", "bertkit.padding", "bertkit.tokenization", "bertkit.config")
    banned = ("bertkit.training", "bertkit.tasks", "bertkit.cli", "bertkit.inference", "bertkit.data")
    bad = [f"{m} -> {d}" for m, deps in _modules().items() if m.startswith(core) for d in deps if d.startswith(banned)]
    assert not bad, bad


def test_settings_are_plain_data():
    """settings/ holds values and checks them; deciding a device, quantizing or serving is the library's job. So
    it imports nothing from training/, inference/ or quantization/ (anywhere, inside functions too), and
    importing it loads no torch."""
    import subprocess
    import sys

    banned = ("bertkit.training", "bertkit.inference", "bertkit.quantization")
    bad = [f"{m} -> {d}" for m, deps in _modules().items() if m.startswith("bertkit.settings")
           for d in deps if d.startswith(banned)]
    assert not bad, bad
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, bertkit.settings; print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in loaded if m == "torch" or m.startswith(("torch.", *banned))]
    assert not heavy, f"importing bertkit.settings loads {heavy[:5]}"


def test_a_fresh_process_imports_only_what_it_runs(tmp_path, tiny_checkpoint):
    """Three steps of one fresh process, each checked for what it must not import (one interpreter and torch start
    for the three, 2-3 s of CPU each):

    - bertkit's Trainer, TrainingArguments and DataCollatorWithPadding import neither transformers nor datasets
      nor accelerate;
    - from_pretrained imports no compiler: it built its layers with skip_init, whose draw and empty weights on the
      meta device go through torch._refs, whose first calls import torch._dynamo and sympy (a fresh process's first
      pipeline took 3.0-3.2 s of CPU, 1.4-1.8 s without them);
    - torch.compile's machinery (torch._dynamo: 1.2 s to import, more than torch) loads only where something compiles
      or exports: building a model and running it, the pipelines, the sentence models, the trainer and the command
      line never import it.
    """
    import subprocess
    import sys

    directory = tiny_checkpoint(tmp_path / "m", "BertForSequenceClassification", labels=2)
    code = ("import sys\n"
            "def loaded(*names):\n    return sorted(set(names) & set(sys.modules))\n"
            "import bertkit\nbertkit.Trainer, bertkit.TrainingArguments, bertkit.DataCollatorWithPadding\n"
            "print('trainer', loaded('transformers', 'datasets', 'accelerate'))\n"
            "from bertkit import BertForSequenceClassification\n"
            f"BertForSequenceClassification.from_pretrained({str(directory)!r})\n"
            "print('from_pretrained', loaded('torch._dynamo', 'sympy', 'torch.fx.experimental.symbolic_shapes'))\n"
            "import torch, bertkit.heads, bertkit.inference.pipelines, bertkit.sentence.model, "
            "bertkit.training.trainer, bertkit.cli\n"
            "from bertkit import BertConfig\n"
            "m = BertForSequenceClassification(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, "
            "num_attention_heads=4, intermediate_size=37))\n"
            "ids = torch.tensor([[2, 5, 7, 3], [2, 9, 3, 0]])\n"
            "m(ids, attention_mask=(ids > 0).long(), labels=torch.tensor([0, 1])).loss.backward()\n"
            "print('eager', loaded('torch._dynamo'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.splitlines() == ["trainer []", "from_pretrained []", "eager []"], run.stderr


def test_no_import_cycles():
    edges = _modules()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep in edges and not state.get(dep):
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(edges):
        if not state.get(module):
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(cycles)


def test_the_model_is_plain_pytorch():
    """modeling.py and heads.py, and everything they import, call no private torch op and register no
    process-wide hook: CPU-inference speed-ups are the explicit transform in inference/prepare.py."""
    edges, names = _modules(), _module_names()
    seen, todo = set(), ["bertkit.modeling", "bertkit.heads"]
    while todo:
        module = todo.pop()
        if module not in seen and module in names:
            seen.add(module)
            todo.extend(edges.get(module, ()))
    private = ("torch.ops.", "torch._C.", "register_optimizer_step_post_hook", "register_module_forward_hook",
               "register_module_forward_pre_hook", "register_module_full_backward_hook")
    bad = sorted(f"{m}: {p}" for m in seen for p in private if p in names[m].read_text(encoding="utf-8"))
    assert "bertkit.padding" in seen and not bad, bad
