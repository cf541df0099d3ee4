"""Every public function says what it returns and what it raises (Google style sections).

The public functions are those in the ``__all__`` of the modules below. A function whose return
annotation is not None has a ``Returns:`` (or ``Yields:``) section; one whose source holds a
``raise`` statement has a ``Raises:`` section.
"""

import ast
import importlib
import inspect
import re
import textwrap

import pytest

PUBLIC_MODULES = (
    "snens",
    "snens.nn",
    "snens.method.loss",
    "snens.method.step",
    "snens.metrics",
    "snens.baselines",
    "snens.evaluation.protocol",
    "snens.evaluation.calibration",
    "snens.evaluation.conformal",
    "snens.models",
    "snens.models.llm",
    "snens.data",
)
# these need optional packages (transformers, peft): a module that cannot be imported is left
# out, and the last test says so where the packages are installed
OPTIONAL_MODULES = ("snens.integrations.huggingface", "snens.integrations.peft")

# 104 when this was written; a floor, so the checks cannot pass on an empty list
MIN_FUNCTIONS = 100

RETURNS = re.compile(r"^(Returns|Yields):\s*$", re.MULTILINE)
RAISES = re.compile(r"^Raises:\s*$", re.MULTILINE)


def _public_functions() -> list[tuple[str, object]]:
    """(qualified name, function) of every function in a listed ``__all__``, each object once."""
    modules = [importlib.import_module(name) for name in PUBLIC_MODULES]
    for name in OPTIONAL_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    found, seen = [], set()
    for module in modules:
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isfunction(obj) and id(obj) not in seen:
                seen.add(id(obj))
                found.append((f"{module.__name__}.{attr}", obj))
    return found


def _returns_something(fn) -> bool:
    annotation = inspect.signature(fn).return_annotation
    return annotation not in (inspect.Signature.empty, None, "None")


def _raises(fn) -> bool:
    """Whether the function's source (nested functions included) holds a ``raise`` statement;
    the word in a docstring, comment or string does not count."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return any(isinstance(node, ast.Raise) for node in ast.walk(tree))


def test_every_public_function_documents_its_returns_and_raises():
    functions = _public_functions()
    assert len(functions) >= MIN_FUNCTIONS, [name for name, _ in functions]
    offending = []
    for name, fn in functions:
        doc = inspect.getdoc(fn)
        if not doc:
            offending.append(f"{name}: no docstring")
            continue
        if _returns_something(fn) and not RETURNS.search(doc):
            offending.append(f"{name}: no Returns: section")
        if _raises(fn) and not RAISES.search(doc):
            offending.append(f"{name}: raises, no Raises: section")
    assert offending == [], "\n".join(offending)


@pytest.mark.parametrize("module", OPTIONAL_MODULES)
def test_optional_modules_are_checked_where_installed(module):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    names = {name for name, _ in _public_functions()}
    assert any(name.startswith(module + ".") for name in names)
