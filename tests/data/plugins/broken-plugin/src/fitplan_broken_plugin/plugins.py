"""One plugin object per way a plugin can be broken. Each quantity or reducer name starts with
``broken_`` so that the tests can check that errors name it."""

from __future__ import annotations

import fitplan
from fitplan import OptimizerSpec, Quantity, quantity, reducer


class Raises:
    """Raises while declaring its quantities."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        raise RuntimeError("broken_raises could not build its quantities")


class ReturnsList:
    """Returns its declarations instead of calling register()."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes")
        def broken_returned_bytes(param_count):
            return param_count

        return [broken_returned_bytes]


class RegistersWrongType:
    """Registers a bare function where a Quantity is expected."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        def broken_bare_function_bytes(param_count):
            return param_count

        register(broken_bare_function_bytes)


class Duplicate:
    """Declares a quantity the built-in model_states plugin already declares."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        register(Quantity(name="gradient_bytes", func=lambda trainable_param_count: 0, unit="bytes"))


class Cycle:
    """Two quantities that depend on each other."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes")
        def broken_cycle_a_bytes(broken_cycle_b_bytes):
            return broken_cycle_b_bytes

        @quantity("bytes")
        def broken_cycle_b_bytes(broken_cycle_a_bytes):
            return broken_cycle_a_bytes

        register(broken_cycle_a_bytes)
        register(broken_cycle_b_bytes)


class UnknownTarget:
    """A reducer on a term nobody declares (a typo of optimizer_state_bytes)."""

    @fitplan.hookimpl
    def fitplan_register_reducers(self, register):
        register(reducer("optimizer_state_byte", when=lambda: True, name="broken_halve")(lambda value: value // 2))


class UnknownHook:
    """Implements a hook that does not exist (a typo of fitplan_register_quantities)."""

    @fitplan.hookimpl
    def fitplan_register_quantity(self, register):
        pass


def _raising_state_bytes(ctx):
    raise ValueError("broken_optimizer has no rule for these tensors")


class BadOptimizer:
    """An optimizer whose state_bytes raises."""

    @fitplan.hookimpl
    def fitplan_register_optimizers(self, register):
        register(OptimizerSpec(name="broken_optimizer", state_bytes=_raising_state_bytes, doc="raises"))


class MissingRulesetDir:
    """Ships a ruleset directory that does not exist."""

    @fitplan.hookimpl
    def fitplan_ruleset_dirs(self):
        return ["/nonexistent/broken_rulesets"]


class FailsAtEvaluation:
    """Declares fine, then divides by zero when the estimate is evaluated."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes", category="memory")
        def broken_ratio_bytes(param_count, lora_dropout):
            return param_count / lora_dropout  # lora_dropout defaults to 0.0

        register(broken_ratio_bytes)


class ExitsInHook:
    """Calls sys.exit(0) while declaring its quantities."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        import sys

        sys.exit(0)


class ExitsAtEvaluation:
    """Declares fine, then calls sys.exit(0) when the estimate is evaluated."""

    @fitplan.hookimpl
    def fitplan_register_quantities(self, register):
        @quantity("bytes")
        def broken_exit_bytes(param_count):
            import sys

            sys.exit(0)

        register(broken_exit_bytes)


raises = Raises()
exits_in_hook = ExitsInHook()
exits_at_evaluation = ExitsAtEvaluation()
returns_list = ReturnsList()
registers_wrong_type = RegistersWrongType()
duplicate = Duplicate()
cycle = Cycle()
unknown_target = UnknownTarget()
unknown_hook = UnknownHook()
bad_optimizer = BadOptimizer()
missing_ruleset_dir = MissingRulesetDir()
fails_at_evaluation = FailsAtEvaluation()
