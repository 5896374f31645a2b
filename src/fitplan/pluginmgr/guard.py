"""Each plugin's hook implementations guarded one by one, so that pluggy calls them and a failing plugin stays named
and isolated.

fitplan calls every hook through pluggy (``pm.hook.NAME(...)``): pluggy's call order (last registered first,
``tryfirst`` / ``trylast``), its wrappers (``wrapper=True``, old-style ``hookwrapper=True``) and ``firstresult``
apply as pluggy documents. A plugin is not registered as it is: :meth:`Guard.stand_in` registers an object holding
the plugin's hook implementations, each wrapped with the same hookimpl options (pluggy reads the wrapped function's
arguments through ``__wrapped__``), so that:

* an implementation that raises (``SystemExit`` too, anything but ``KeyboardInterrupt``) is reported as a
  :class:`~fitplan.errors.PluginError` naming the plugin and the hook, and answers nothing; pluggy goes on with the
  other implementations (a wrapper's own failure, before or after its ``yield``, leaves the result as it was);
* a declaration hook's implementation that returns something is reported (declarations go through ``register``);
* a :class:`~fitplan.errors.FitplanError` raised from a hook that acts on the user's scenario (:data:`USER_HOOKS`)
  is about that input and reaches the user unchanged, as one raised by a quantity does;
* while an implementation (or a wrapper's part) runs, :attr:`Guard.plugin` names its plugin: ``register`` callbacks
  tag declarations with it, and :meth:`Guard.answers` tells which plugin answered each result.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Generator
from typing import Any

from fitplan.errors import FitplanError, PluginError

BLOCK_ENV = "FITPLAN_BLOCK_PLUGINS"
DECLARATION_HOOKS = frozenset({
    "fitplan_register_quantities", "fitplan_register_reducers", "fitplan_register_optimizers",
    "fitplan_register_names", "fitplan_register_formats", "fitplan_register_report_sections",
    "fitplan_register_commands",
})
"""Hooks that declare through a callback (``register``, or the ``cli`` group) and return nothing."""
USER_HOOKS = frozenset({"fitplan_validate"})
"""Hooks that act on the user's scenario: a :class:`FitplanError` they raise is about that input."""


def interrupt(e: BaseException) -> None:
    """Ctrl-C (and ``GeneratorExit``) go on; anything else a plugin raises is recorded as its error."""
    if isinstance(e, (KeyboardInterrupt, GeneratorExit)):
        raise e


def raised(plugin: str, e: BaseException, where: str) -> PluginError:
    """The problem of ``plugin`` raising ``e`` in hook ``where``."""
    what = f"exited (sys.exit({e.code!r}))" if isinstance(e, SystemExit) else f"raised {type(e).__name__}: {e}"
    return PluginError(f"plugin {plugin!r} {what} in {where}", field=where, value=plugin,
                       suggestion=f"block it with {BLOCK_ENV}={plugin}")


class StandIn(types.ModuleType):
    """What pluggy registers for one plugin: its guarded hook implementations as attributes (:attr:`plugin` is the
    plugin itself). A module, so that pluggy's scan of it reads its few attributes, not an instance's class."""

    def __init__(self, plugin: object, name: str) -> None:
        super().__init__(f"fitplan-plugin:{name}")
        self.plugin = plugin

    def __repr__(self) -> str:
        return f"<guarded plugin {self.__name__.partition(':')[2]!r}: {self.plugin!r}>"


class Guard:
    """The guards of one plugin manager's implementations: where their problems go, which plugin is running,
    and which plugin answered what."""

    def __init__(self, project: str, report: Callable[[PluginError], None]) -> None:
        self.marker = f"{project}_impl"
        self.report = report
        self.running: list[str] = []
        self._answers: dict[int, tuple[str, Any]] = {}

    @property
    def plugin(self) -> str | None:
        """The plugin whose implementation (or wrapper part) is running now; None outside a hook call."""
        return self.running[-1] if self.running else None

    def stand_in(self, pm: Any, plugin: object, name: str) -> StandIn:
        """A :class:`StandIn` for ``plugin``: each attribute that ``pm`` takes for a hook implementation, guarded."""
        out = StandIn(plugin, name)
        for attr in self._candidates(plugin):
            opts = pm.parse_hookimpl_opts(plugin, attr)
            if opts is None:
                continue
            hook = opts.get("specname") or attr
            fn = getattr(plugin, attr)
            if opts.get("wrapper"):
                guarded = self._wrapper(fn, name, hook)
            elif opts.get("hookwrapper"):
                guarded = self._old_wrapper(fn, name, hook)
            else:
                guarded = self._plain(fn, name, hook)
            setattr(guarded, self.marker, dict(opts))
            setattr(out, attr, guarded)
        return out

    def _candidates(self, plugin: object) -> list[str]:
        """The attributes of ``plugin`` that may be hook implementations: of a module, those marked (a look at its
        dictionary, which is all pluggy's scan would find there); of any other object, every name (pluggy's
        own scan decides, without running properties)."""
        if isinstance(plugin, types.ModuleType):
            return [k for k, v in vars(plugin).items()
                    if getattr(v, self.marker, None) is not None or getattr(getattr(v, "__func__", None), self.marker, None)
                    is not None]
        return dir(plugin)

    def answers(self, results: list[Any]) -> list[tuple[str, Any]]:
        """``(plugin, result)`` for each result of a hook call, in pluggy's order: the plugin whose implementation
        returned it, or the wrapper's that put it there (``"?"`` when neither is known). Read once: the record of
        each result is dropped here."""
        return [(self._answers.pop(id(r), ("?", r))[0], r) for r in results]

    # ---- the guards

    def _failed(self, plugin: str, hook: str, e: BaseException) -> None:
        interrupt(e)
        if isinstance(e, FitplanError) and not isinstance(e, PluginError) and hook in USER_HOOKS:
            raise e
        self.report(e if isinstance(e, PluginError) else raised(plugin, e, hook))

    def _answered(self, plugin: str, hook: str, result: Any) -> Any:
        if result is not None and hook in DECLARATION_HOOKS:
            self.report(PluginError(f"plugin {plugin!r} returned {type(result).__name__} from {hook}; declarations go "
                                    "through register()", field=hook, value=plugin))
            return None
        if result is not None:
            self._answers[id(result)] = (plugin, result)
        return result

    def _plain(self, fn: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self.running.append(plugin)
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - isolate the plugin (interrupt() lets Ctrl-C through)
                self._failed(plugin, hook, e)
                return None
            finally:
                self.running.pop()
            return self._answered(plugin, hook, result)
        return guarded

    def _resume(self, plugin: str, hook: str, gen: Generator | None, sent: Any = None,
                thrown: BaseException | None = None) -> tuple[bool, Any]:
        """Run a wrapper's part after its ``yield`` as ``plugin`` (``gen.send(sent)``, or ``gen.throw(thrown)``):
        ``(True, what it returned)`` when it returned; ``(False, None)`` when it failed or yielded again (both
        reported). ``thrown`` raised again by the wrapper goes on, as pluggy lets it."""
        if gen is None:
            return False, None
        self.running.append(plugin)
        try:
            gen.throw(thrown) if thrown is not None else gen.send(sent)
        except StopIteration as stop:
            return True, stop.value
        except BaseException as e:  # noqa: BLE001 - isolate the plugin
            if e is thrown:
                raise
            self._failed(plugin, hook, e)
            return False, None
        finally:
            self.running.pop()
        gen.close()
        self.report(PluginError(f"plugin {plugin!r}: its {hook} wrapper yielded twice", field=hook, value=plugin,
                                suggestion=f"block it with {BLOCK_ENV}={plugin}"))
        return False, None

    def _start(self, fn: Callable[..., Any], plugin: str, hook: str, args: tuple, kwargs: dict) -> Generator | None:
        """A wrapper's generator run to its ``yield`` (None when it failed before: reported)."""
        self.running.append(plugin)
        try:
            gen = fn(*args, **kwargs)
            next(gen)
            return gen
        except StopIteration:
            self.report(PluginError(f"plugin {plugin!r}: its {hook} wrapper did not yield", field=hook, value=plugin,
                                    suggestion=f"block it with {BLOCK_ENV}={plugin}"))
        except BaseException as e:  # noqa: BLE001 - isolate the plugin
            self._failed(plugin, hook, e)
        finally:
            self.running.pop()
        return None

    def _wrapper(self, fn: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Generator]:
        """A new-style wrapper (``wrapper=True``): it receives the result (or the exception) at its ``yield`` and
        returns the result it wants; if it fails, the result stays what the implementations made."""
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Generator:
            gen = self._start(fn, plugin, hook, args, kwargs)
            try:
                result = yield
            except BaseException as exc:  # what the inner call raised: the wrapper sees it, as pluggy documents
                done, value = self._resume(plugin, hook, gen, thrown=exc)
                if done:
                    return value
                raise
            done, value = self._resume(plugin, hook, gen, sent=result)
            if not done:
                return result
            if value is not result and value is not None:
                self._answers.update({id(v): (plugin, v) for v in (value if isinstance(value, list) else [value])
                                      if id(v) not in self._answers})
            return value
        return guarded

    def _old_wrapper(self, fn: Callable[..., Any], plugin: str, hook: str) -> Callable[..., Generator]:
        """An old-style wrapper (``hookwrapper=True``): it receives pluggy's ``Result`` at its ``yield`` and may
        change it (``force_result``); if it fails, the result stays as it was."""
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Generator:
            gen = self._start(fn, plugin, hook, args, kwargs)
            outcome = yield
            self._resume(plugin, hook, gen, sent=outcome)
        return guarded
