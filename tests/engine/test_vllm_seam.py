"""The vLLM seam: only slaq.engine.vllm_compat imports vLLM, and every vLLM method slaq overrides
still has the signature the installed vLLM gives it, so an upgrade shows exactly what broke."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from slaq.engine.vllm_compat import KVCacheManager
from tests.support.layout import module_name, python_sources

ROOT = Path(__file__).resolve().parents[2]
SEAM = ROOT / "engine" / "src" / "slaq" / "engine" / "vllm_compat"
SEAM_MODULE = "slaq.engine.vllm_compat"
# Scripts are not package modules but import what the package does; tests/ and e2e/ may use vLLM.
EXTRA_FOLDERS = ("scripts",)


def _package_sources() -> Iterator[Path]:
    yield from python_sources()
    for folder in EXTRA_FOLDERS:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _is_vllm(name: str) -> bool:
    return name == "vllm" or name.startswith("vllm.")


def _imported_by_call(node: ast.Call) -> list[str]:
    """The module a call to `importlib.import_module` or `__import__` names with a string literal."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called not in ("import_module", "__import__"):
        return []
    first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
    return [first.value] if isinstance(first, ast.Constant) and isinstance(first.value, str) else []


def vllm_imports(text: str, filename: str = "<text>") -> list[int]:
    """Lines of `text` that import vLLM (anywhere: module level, in functions, under TYPE_CHECKING,
    or by name through `importlib.import_module` / `__import__` with a string literal)."""
    lines = []
    for node in ast.walk(ast.parse(text, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call):
            names = _imported_by_call(node)
        else:
            continue
        if any(_is_vllm(name) for name in names):
            lines.append(node.lineno)
    return sorted(lines)


def _imports_the_seam(text: str) -> bool:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(a.name.startswith(SEAM_MODULE) for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith(SEAM_MODULE) or (node.module == "slaq.engine" and any(a.name == "vllm_compat" for a in node.names))):
            return True
    return False


def _seam_users() -> Iterator[str]:
    """Package modules that import the seam: the only ones that can subclass a vLLM class."""
    for source in python_sources():
        if source.is_relative_to(SEAM) or _imports_the_seam(source.read_text()):
            yield module_name(source)


def test_only_the_seam_imports_vllm() -> None:
    offenders = {}
    for source in _package_sources():
        if source.is_relative_to(SEAM):
            continue
        lines = vllm_imports(source.read_text(), str(source))
        if lines:
            offenders[str(source.relative_to(ROOT))] = lines
    assert not offenders, f"vLLM imported outside {SEAM.relative_to(ROOT)}: {offenders}"


def test_no_module_of_the_seam_is_named_like_one_of_its_helpers() -> None:
    # Importing slaq.engine.vllm_compat.X sets the package's attribute X to the module, replacing a helper of that name.
    helpers = {node.name for node in ast.parse((SEAM / "__init__.py").read_text()).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    helpers |= {t.id for node in ast.parse((SEAM / "__init__.py").read_text()).body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    assert "block_manager" in helpers and "attached_info" in helpers  # the scan reads the helpers
    clashes = sorted(module.stem for module in SEAM.glob("*.py") if module.stem in helpers)
    assert not clashes, f"modules of the seam named like its helpers: {clashes}"


def test_the_import_scan_sees_every_form_of_import() -> None:
    assert vllm_imports("import vllm") == [1]
    assert vllm_imports("import os, vllm.config as c") == [1]
    assert vllm_imports("def f():\n    from vllm.v1.request import Request\n") == [2]
    assert vllm_imports("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vllm import LLM\n") == [3]
    assert vllm_imports("import vllm_compat\nfrom slaq.engine.vllm_compat import Request\nfrom . import vllm\n") == []
    assert vllm_imports('import importlib\nimportlib.import_module("vllm.v1.core.sched.async_scheduler")\n') == [2]
    assert vllm_imports('from importlib import import_module\ndef f():\n    return import_module(name="vllm.config")\n') == [3]
    assert vllm_imports('__import__("vllm")') == [1]
    assert vllm_imports('import importlib\nimportlib.import_module("slaq.engine.vllm_compat")\n__import__("vllm_compat")\n') == []


def test_no_registered_policy_loads_its_scheduler_from_vllm_directly() -> None:
    # A policy names its module as data and loads it with importlib, out of sight of the import scan.
    from slaq.bench.policies import POLICIES

    assert POLICIES["fcfs"].module == SEAM_MODULE
    assert {name: spec.module for name, spec in POLICIES.items() if _is_vllm(spec.module)} == {}


# -- overridden vLLM methods -------------------------------------------------------------------
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _shape(parameters: list[inspect.Parameter]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in parameters]


def signature_mismatch(override: Callable[..., Any], base: Callable[..., Any]) -> str | None:
    """Why `override` cannot stand in for `base` (None when it can). Its parameters must be the
    base's (names, kinds, defaults; annotations aside), or a leading run of them followed by
    `**kwargs` that takes the rest by keyword (as vLLM passes them), or a plain `(*args, **kwargs)`
    pass-through."""
    mine, theirs = (list(inspect.signature(f).parameters.values()) for f in (override, base))
    if [p.kind for p in mine[1:]] == list(_VARIADIC):
        return None
    if mine and mine[-1].kind is inspect.Parameter.VAR_KEYWORD and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in mine):
        named = mine[:-1]
        rest = theirs[len(named):]
        if _shape(named) != _shape(theirs[:len(named)]):
            return f"{_shape(named)} is not the start of {_shape(theirs)}"
        if any(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL) for p in rest):
            return f"**kwargs cannot take {[p.name for p in rest]}"
        return None
    if _shape(mine) != _shape(theirs):
        return f"{_shape(mine)} != {_shape(theirs)}"
    return None


def _overrides() -> Iterator[tuple[str, Callable[..., Any], Callable[..., Any]]]:
    """(qualified name, slaq's method, the installed vLLM's) for every vLLM method a slaq class defines."""
    for module_name in _seam_users():
        module = importlib.import_module(module_name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            vllm_base = next((b for b in cls.__mro__ if b.__module__.split(".")[0] == "vllm"), None)
            if vllm_base is None:
                continue
            for name, attribute in vars(cls).items():
                if not inspect.isfunction(attribute) or (name.startswith("__") and name != "__init__"):
                    continue
                base = getattr(vllm_base, name, None)
                if inspect.isfunction(base):
                    yield f"{cls.__module__}.{cls.__qualname__}.{name}", attribute, base


def test_every_overridden_vllm_method_keeps_the_installed_signature() -> None:
    found = {name: signature_mismatch(mine, theirs) for name, mine, theirs in _overrides()}
    # The block manager's three overrides, the scheduler's and the load-failure fix are among those checked.
    manager = "slaq.engine.vllm_compat.kv_cache_manager.BudgetedKVCacheManager"
    for expected in (f"{manager}.allocate_slots", f"{manager}.free", f"{manager}.pop_blocks_for_free",
                     "slaq.engine.scheduler.SLAScheduler.__init__", "slaq.engine.scheduler.SLAScheduler.add_request",
                     "slaq.engine.scheduler.SLAScheduler.update_from_output",
                     "slaq.engine.vllm_compat.RecomputesLoadFailures._update_requests_with_invalid_blocks",
                     "slaq.engine.vllm_compat.ReportsFreedRequests._free_request",
                     "slaq.engine.scheduler.SLAScheduler.schedule", "slaq.bench.oracle.OracleScheduler.schedule",
                     "slaq.engine.kv_security.connector.SlaqKVConnector.build_connector_meta"):
        assert expected in found, sorted(found)
    assert {name: why for name, why in found.items() if why} == {}


def vllm_overrides_outside_the_seam(classes: list[type], vllm_class: type) -> dict[str, list[str]]:
    """Methods of `vllm_class` that `classes` (subclasses of it) define themselves, by class."""
    found: dict[str, list[str]] = {}
    for cls in classes:
        if issubclass(cls, vllm_class) and cls.__module__.split(".")[0] != "vllm":
            own = sorted(name for name, attribute in vars(cls).items()
                         if inspect.isfunction(attribute) and inspect.isfunction(getattr(vllm_class, name, None)))
            if own:
                found[f"{cls.__module__}.{cls.__qualname__}"] = own
    return found


def _classes_outside_the_seam() -> list[type]:
    classes = []
    for module_name in _seam_users():
        if module_name == SEAM_MODULE or module_name.startswith(SEAM_MODULE + "."):
            continue
        module = importlib.import_module(module_name)
        classes += [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
    return classes


def test_only_the_seam_overrides_methods_of_vllms_block_manager() -> None:
    from slaq.engine.blocks import SLABlockManager

    classes = _classes_outside_the_seam()
    assert SLABlockManager in classes  # the scan reaches the block manager
    assert vllm_overrides_outside_the_seam(classes, KVCacheManager) == {}


def test_the_override_scan_sees_a_block_manager_overriding_vllm() -> None:
    from slaq.engine.vllm_compat.kv_cache_manager import BudgetedKVCacheManager

    class FreesItself(BudgetedKVCacheManager):
        def free(self, request): ...  # noqa: E704

        def slaq_free(self, request): ...  # noqa: E704

    assert list(vllm_overrides_outside_the_seam([FreesItself], KVCacheManager).values()) == [["free"]]


def test_the_seams_block_manager_alone_allocates_and_frees_as_vllm() -> None:
    from slaq.api.common import Tier
    from slaq.engine import vllm_compat as vc
    from slaq.engine.standalone import Driver, build_scheduler, make_request
    from slaq.engine.vllm_compat.kv_cache_manager import BudgetedKVCacheManager

    runs = []
    for manager_cls in (None, BudgetedKVCacheManager):
        scheduler = build_scheduler(vc.AsyncScheduler, num_blocks=50)
        if manager_cls is not None:
            vc.adopt_block_manager(scheduler, manager_cls)
        driver = Driver(scheduler)
        requests = [make_request(Tier.BATCH, prompt_tokens=40, max_tokens=20), make_request(Tier.BATCH, prompt_tokens=30, max_tokens=5)]
        for request in requests:
            driver.add(request)
        driver.step()
        held = [len(vc.request_blocks(scheduler.kv_cache_manager, vc.request_id(r))) for r in requests]
        driver.run_until_idle()
        runs.append((held, vc.free_blocks(scheduler.kv_cache_manager), vc.free_queue_order(scheduler.kv_cache_manager)))
    assert runs[0] == runs[1] and runs[0][0] == [3, 2]


def _allocate_renamed(self, request, num_tokens, num_new_computed_tokens=0, **kwargs): ...  # noqa: E704
def _allocate_reordered(self, num_new_tokens, request, **kwargs): ...  # noqa: E704
def _allocate_without_kwargs(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None): ...  # noqa: E704
def _allocate_changed_default(self, request, num_new_tokens, num_new_computed_tokens=1, **kwargs): ...  # noqa: E704
def _free_with_extra(self, request, now): ...  # noqa: E704


@pytest.mark.parametrize("override", [_allocate_renamed, _allocate_reordered, _allocate_without_kwargs, _allocate_changed_default])
def test_the_signature_check_sees_a_changed_allocate_slots(override) -> None:
    assert signature_mismatch(override, KVCacheManager.allocate_slots) is not None


def test_the_signature_check_sees_an_extra_parameter_and_passes_a_pass_through() -> None:
    assert signature_mismatch(_free_with_extra, KVCacheManager.free) is not None
    assert signature_mismatch(lambda self, *args, **kwargs: None, KVCacheManager.free) is None
    assert signature_mismatch(lambda self, request: None, KVCacheManager.free) is None


def test_greedy_inputs_ask_for_exactly_max_tokens_from_token_ids() -> None:
    from slaq.engine.vllm_compat.llm import greedy_inputs

    inputs, params = greedy_inputs([[5, 6, 7], [8]], 4)
    assert [i["prompt_token_ids"] for i in inputs] == [[5, 6, 7], [8]]
    assert (params.max_tokens, params.ignore_eos, params.temperature, params.detokenize) == (4, True, 0.0, False)


def test_a_decode_within_the_hooks_room_skips_the_hook_and_one_beyond_it_calls_it() -> None:
    from slaq.api.common import Tier
    from slaq.engine import vllm_compat as vc
    from slaq.engine.standalone import BLOCK_SIZE, Driver, build_scheduler, make_request
    from slaq.engine.vllm_compat.kv_cache_manager import BudgetedKVCacheManager

    class CountsHookCalls(BudgetedKVCacheManager):
        ends: list[int]  # computed + new tokens of each allocation the hook saw

        def slaq_allocate_slots(self, request, new_tokens, *args):
            self.ends.append(vc.computed_tokens(request) + new_tokens)
            return super().slaq_allocate_slots(request, new_tokens, *args)

    scheduler = build_scheduler(vc.AsyncScheduler, num_blocks=50)
    manager = vc.adopt_block_manager(scheduler, CountsHookCalls)
    manager.ends, manager.slaq_decode_room = [], {}
    driver = Driver(scheduler)
    request = make_request(Tier.BATCH, prompt_tokens=40, max_tokens=20)
    driver.add(request)
    driver.step()
    assert manager.ends == [40]  # the prompt: not a decode, the hook sees it
    manager.slaq_decode_room[vc.request_id(request)] = 3 * BLOCK_SIZE
    driver.run_until_idle()
    # Its decodes end at 41 .. 59: those within the room (41 .. 48) went straight to vLLM, every one past it reached the hook.
    assert manager.ends == [40, *range(3 * BLOCK_SIZE + 1, 60)]
    assert len(driver.finished) == 1
