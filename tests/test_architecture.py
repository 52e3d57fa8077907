"""The seams the layout promises, checked on the source: vLLM only inside engine/, TRL privates only in
trainer/_trl.py, trainer/ imported only by the CLI and the benchmarks, test workers independent of bench/, and both
engines satisfying the Engine protocol."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from colocate_grpo.engine.base import Engine, ServedEngine

PACKAGE = Path(__file__).resolve().parents[1] / "colocate_grpo"
TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_only_engine_imports_vllm():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in sources(PACKAGE)
        if p.parent.name != "engine"
        and any(m == "vllm" or m.startswith("vllm.") for m in imported_modules(p))
    ]
    assert offenders == []


def test_the_import_scan_sees_function_level_vllm_imports():
    """Control: engine/cpu.py imports vLLM only inside functions, and the scan still sees it."""
    assert any(m.startswith("vllm.") for m in imported_modules(PACKAGE / "engine" / "cpu.py"))


def test_nothing_outside_engine_reaches_into_the_llm_object():
    pattern = re.compile(r"\.llm\.|\.llm_engine\b|\._runner\b")
    offenders = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in sources(PACKAGE)
        if p.parent.name != "engine"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith(("#", '"', "`"))
    ]
    assert offenders == []


def test_trl_privates_only_through_the_trl_seam():
    pattern = re.compile(
        r"\b(self|trainer)\._(metrics|tokenizer|last_loaded_step)\b|grpo_trainer\.VLLMGeneration"
    )
    offenders = [
        f"{p.relative_to(PACKAGE)}:{n}"
        for p in sources(PACKAGE)
        if p.name != "_trl.py"
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_only_cli_and_bench_import_the_trainer():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in sources(PACKAGE)
        if p.parent.name not in ("trainer", "bench") and p.name not in ("cli.py", "__init__.py")
        if any(m.startswith("colocate_grpo.trainer") for m in imported_modules(p))
    ]
    assert offenders == []


def test_test_workers_import_nothing_from_bench():
    offenders = [
        p.name
        for p in sources(TESTS / "workers")
        if "colocate_grpo.bench" in p.read_text() or "bench." in p.read_text()
    ]
    assert offenders == []


def test_both_engines_satisfy_the_protocol():
    from colocate_grpo.engine.colocated import ColocatedEngine
    from colocate_grpo.server.remote import RemoteEngine

    def members(protocol) -> set[str]:
        return {
            name
            for klass in protocol.__mro__
            if klass not in (object,) and klass.__name__ not in ("Protocol", "Generic")
            for name in vars(klass)
            if not name.startswith("_")
        }

    for engine, protocol in ((ColocatedEngine, ServedEngine), (RemoteEngine, Engine)):
        missing = sorted(name for name in members(protocol) if not hasattr(engine, name))
        assert missing == [], f"{engine.__name__} lacks {missing}"


def test_every_module_stays_within_its_size_budget():
    big = {
        str(p.relative_to(PACKAGE)): n
        for p in sources(PACKAGE)
        if (n := len(p.read_text().splitlines())) > 420
    }
    assert big == {}
