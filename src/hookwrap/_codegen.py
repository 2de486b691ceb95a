"""Generated code: the pure twin's dispatch functions and straight-line runners
for a chain's call shapes, and (both twins) a custom event's listeners.

A per-call interpreter loop over plans costs ~20x a hand-written loop in pure
Python; code generated from the plan (as attrs and dataclasses generate their
methods) costs about what the hand loop does. ``_rules`` holds the rules of a
call as plain Python (``absorb``, ``call_around``, ``run_emit_steps``): the code
generated here is their mirror, written out for one plan (marked so where it
does), and tests/test_differential.py holds it equal to them. Every generated source is registered with ``linecache`` under
a name that says what it runs, so a traceback or pdb through it shows its lines.

Nothing here runs per call: code is generated when a chain first sees a call
shape (at most MAX_CALL_SHAPES per chain), or an event a set of keywords (the
compiled twin's emit runs on these runners under torch.compile).
"""

from __future__ import annotations

import hashlib
import linecache
import threading
from keyword import iskeyword as _iskeyword
from types import FunctionType
from typing import Any, Callable, cast

from ._policy import (
    CLASSMETHOD,
    FUNCTION,
    METHOD,
    POST,
    PRE,
    SLOT_DEFAULT,
    SLOT_RESULT,
    STATE_KEY,
    EmitStep,
    step_slots,
)
from ._rules import finish_emit, finish_phase
from .errors import StopTraining
from .errors import emit_return_error as _emit_return_error
from .errors import note_callback as _note_callback
from .errors import proceed_twice as _proceed_twice
from .errors import return_error as _return_error

__all__ = ["NOT_PASSED", "dispatcher", "emit_runner", "runner", "slot_count"]

# Generated sources registered with linecache, by file name. The name holds a
# digest of the source, so planning the same chain again (callbacks added and
# removed each epoch) finds its name registered; past _SOURCES_KEPT, new code
# runs unregistered (a traceback shows no lines for it), so memory stays bounded.
# Nothing is ever removed: another thread formatting a traceback reads
# linecache's dict without a lock (3.11: `name in cache`, then `cache[name]`).
_SOURCES_KEPT = 1024
_sources: set[str] = set()
_sources_lock = threading.Lock()


def _define(source: str, what: str, ns: dict[str, Any], name: str) -> Any:
    """Run the generated ``source`` in ``ns`` and return its ``name``; its lines
    are registered with linecache as ``<hookwrap WHAT #digest>`` (the digest keeps
    two different sources of one description apart)."""
    what = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in what)  # a file name: no NUL, newline
    what = what if len(what) <= 200 else what[:197] + "..."
    digest = hashlib.blake2s(source.encode(), digest_size=4).hexdigest()
    filename = f"<hookwrap {what} #{digest}>"
    exec(compile(source, filename, "exec"), ns)  # noqa: S102 - generated from plans
    if filename not in linecache.cache:  # (new, or linecache.clearcache() ran)
        with _sources_lock:
            if filename in _sources or len(_sources) < _SOURCES_KEPT:
                _sources.add(filename)
                linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return ns[name]


# A dispatch function takes a call's first positional arguments (its "slots") as
# positional-only parameters defaulting to NOT_PASSED, then *args and **kwargs.
# It accepts every call the function would and knows exactly what was passed and
# how (around advice and errors see the call as it was made), and the usual call
# (the function's required arguments, by position) reaches the function without
# packing them into a tuple and a dict: a `*args, **kwargs` wrapper alone costs
# ~3.8x a bare call.
NOT_PASSED: Any = type("NotPassed", (), {"__repr__": lambda self: "<not passed>"})()
# A function with more required positional arguments takes the general path.
_MAX_SLOTS = 8


def slot_count(func: Any) -> int:
    """How many positional arguments every call of ``func`` passes (its required
    positional parameters), up to _MAX_SLOTS; 0 for what is not a plain function."""
    if not isinstance(func, FunctionType):
        return 0
    return min(func.__code__.co_argcount - len(func.__defaults__ or ()), _MAX_SLOTS)


# Per binding (FUNCTION, METHOD, CLASSMETHOD): what makes a call's chain the one
# cached, read from the call's first argument (FIRST), or the join point's owner.
_CACHED = {FUNCTION: "chain.tp is jp.owner", METHOD: "chain.tp is type(FIRST)",
           CLASSMETHOD: "chain.tp is FIRST"}
_dispatchers: dict[int, Callable[..., Any]] = {}


def dispatcher(n: int) -> Callable[..., Any]:
    """``make(jp, func, owned)``: ``n``-slot dispatch functions, one per binding,
    in binding order. They share their free variables, so that one's
    ``__code__`` can replace another's."""
    made = _dispatchers.get(n)
    if made is not None:
        return made
    slots = [f"a{i}" for i in range(n)]
    passed = ", ".join(slots)
    packed_slots = "".join(f"{slot}, " for slot in slots)
    params = "".join(f"{slot}=NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
    packed = _packed(slots)
    source = ["def make(jp, func, owned):"]
    for binding in (FUNCTION, METHOD, CLASSMETHOD):
        # A call passing keywords, or other positional arguments than the slots:
        # the function if nothing can run (as below), else the general path.
        cached = _CACHED[binding].replace("FIRST", "args[0]")
        if binding != FUNCTION:
            cached = f"args and {cached}"
        if binding == METHOD:
            cached += (" and chain.valid and (chain.passthrough or chain.empty"
                       f" and args[0].{STATE_KEY} is None)")
        else:
            cached += " and chain.valid and chain.passthrough"
        source += [
            f"  def dispatch({params}*args, **kwargs):",
            f"    if args or kwargs{f' or {slots[-1]} is NOT_PASSED' if slots else ''}:",
        ] + ([f"        args = {packed}"] if slots else []) + [
            "        chain = jp._chain",
            f"        if {cached}:",
            "            return func(*args, **kwargs)",
            "        return owned(jp, args, kwargs)",
        ]
        if slots or binding == FUNCTION:
            obj = "None" if binding == FUNCTION else "a0"
            source += [
                "    chain = jp._chain",
                f"    if {_CACHED[binding].replace('FIRST', 'a0')} and chain.valid:",  # this call's class's
                "        if chain.passthrough:",
                f"            return func({passed})",
            ]
            if binding != FUNCTION:  # an instance may hold callbacks of its own
                source += [
                    "        if chain.check_state:",
                    f"            state = a0.{STATE_KEY}",  # its class holds None (class_record)
                    "            if state is not None:",  # HookState.chain_for, its hit inline
                    "                try:",  # (a subscript, not .get: no method call)
                    "                    own = state.chains[jp]",
                    "                except KeyError:",
                    "                    own = None",
                    "                if own is None or not own.valid or own.base is not chain:",
                    "                    own = state.chain_for(jp, chain)",
                    "                chain = own",
                ]
            source += [
                "        if chain.empty:",  # a sibling holds callbacks, this one none
                f"            return func({passed})",
                f"        run = chain.runners.get({n})",  # None until _dispatch compiles it
                "        if run:",
                f"            return run(func, {obj}{''.join(', ' + slot for slot in slots)})",
            ]
        source += [
            f"    return owned(jp, ({packed_slots}), kwargs)",
            "    func, owned  # (never run) every variant closes over these",
        ]
        source.append(f"  v{binding} = dispatch")
    source.append(f"  return v{FUNCTION}, v{METHOD}, v{CLASSMETHOD}")
    ns: dict[str, Any] = {"NOT_PASSED": NOT_PASSED, "STATE_KEY": STATE_KEY}
    made = _dispatchers[n] = cast(Callable[..., Any], _define("\n".join(source) + "\n", f"dispatch, {n} slots", ns, "make"))
    return made



# --- Compiled runners: the pure twin's fast path ------------------------------
#
# For a chain of pre/post callbacks (and around advice) and a call with N
# positional arguments, generate the straight-line code a person would write:
# call each callback with the arguments it named, check what it returned,
# rebind the local, call the function (or the around advice, which calls it).
# A per-call interpreter loop over plans costs ~20x a hand-written loop in pure
# Python; this costs about what the hand loop does.


def runner(chain: Any, nargs: int, kwnames: tuple[str, ...], call_around: Any) -> Any:
    """A function ``run(func, obj, a0, ..., k0, ...)`` for calls with ``nargs``
    positional arguments then the keywords ``kwnames`` (their values, in order),
    or False where the general path is needed."""
    if chain.error or not all(name.isidentifier() and not _iskeyword(name) for name in kwnames):
        return False
    names = [f"a{i}" for i in range(nargs)]
    keywords = {name: f"k{i}" for i, name in enumerate(kwnames)}  # keyword -> its local
    passed = names + [f"{name}={local}" for name, local in keywords.items()]
    ns: dict[str, Any] = {"RE": _return_error, "NOTE": _note_callback, "AROUND": chain.around,
                          "CALL_AROUND": call_around, "STOP": StopTraining, "FINISH": finish_phase}
    body: list[str] = []
    args_list = "[" + ", ".join(names) + "]"
    kwargs_dict = "{" + ", ".join(f"{name!r}: {local}" for name, local in keywords.items()) + "}"
    for phase, steps in ((PRE, chain.pre), (POST, chain.post)):
        if phase == POST and chain.around:  # advice sees the call's arguments, not the object
            seen = names[1:] if chain.around[0].pass_obj else names
            if any(step.gate is not None for step in chain.around):  # which run: decided per call
                as_dict = "{" + ", ".join(f"{name!r}: {local}" for name, local in keywords.items()) + "}"
                body.append(f"result = CALL_AROUND(AROUND, 0, func, obj, ({''.join(n + ', ' for n in seen)}), {as_dict})")
            else:
                body += _around_code(chain.around, seen, passed[nargs:], ns)
        elif phase == POST:
            body.append(f"result = func({', '.join(passed)})")
        for i, step in enumerate(steps):
            tag = f"{'P' if phase == PRE else 'Q'}{i}"
            ns[f"S{tag}"], ns[f"F{tag}"], ns[f"G{tag}"] = step, step.fn, step.gate
            ns[f"N{tag}"] = tuple(ref.name for ref in step.refs)
            slots = step_slots(step, phase, nargs, kwnames)
            if slots is None:
                return False  # *args/**kwargs, or an argument not passed: the general path
            locals_ = names + list(keywords.values())  # slot i: the call's i-th value
            exprs = []
            for j, slot in enumerate(slots):
                if slot == SLOT_RESULT:
                    exprs.append("result")
                elif slot == SLOT_DEFAULT:
                    ns[f"D{tag}_{j}"] = step.refs[j].default
                    exprs.append(f"D{tag}_{j}")
                else:
                    exprs.append(locals_[slot])
            n_kw = len(step.kwnames)
            positional = exprs[: len(exprs) - n_kw]
            keyword = [f"{name}={expr}" for name, expr in zip(step.kwnames, exprs[len(exprs) - n_kw:])]
            call_args = (["obj"] if step.pass_obj else []) + positional + keyword
            absorb: list[str] = []  # the return contract: mirrors _rules.absorb
            if phase == POST:
                if step.consumes:
                    absorb += [f"if r is None and result is not None: raise RE(S{tag}, r, ('return_value',))",
                               "result = r"]
                else:
                    absorb.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif not exprs:
                absorb.append(f"if r is not None: raise RE(S{tag}, r, ())")
            elif len(exprs) == 1:
                absorb += [f"if r is None and {exprs[0]} is not None: raise RE(S{tag}, r, N{tag})",
                           f"{exprs[0]} = r"]
            else:
                none_checks = " or ".join(f"(r[{j}] is None and {x} is not None)" for j, x in enumerate(exprs))
                absorb += [f"if type(r) is not tuple or len(r) != {len(exprs)}: raise RE(S{tag}, r, N{tag})",
                           f"if {none_checks}: raise RE(S{tag}, r, N{tag})",
                           f"{', '.join(exprs)}, = r"]
            ns[f"R{tag}"] = steps[i + 1:]
            block = [
                "try:",
                f"    r = F{tag}({', '.join(call_args)})",
                "except STOP as e:",  # the phase's other callbacks first, then it (_rules.finish_phase)
                f"    NOTE(e, S{tag}.label, S{tag}.event)",
                f"    FINISH(e, R{tag}, obj, {args_list}, {kwargs_dict}, {'result' if phase == POST else 'None'})",
                "except BaseException as e:",
                f"    NOTE(e, S{tag}.label, S{tag}.event)",
                "    raise",
            ] + absorb
            if step.gate is not None:
                block = [f"if G{tag}.admit(obj):"] + ["    " + line for line in block]
            body += block
    body.append("return result")
    params = "".join(", " + local for local in names + list(keywords.values()))
    source = f"def run(func, obj{params}):\n" + "".join(f"    {line}\n" for line in body)
    return _define(source, f"runner of {_runs(chain)}, {nargs} positional{''.join(', ' + k for k in kwnames)}", ns, "run")


def _runs(chain: Any) -> str:
    """What a chain's runner runs, for its file name: the event, and on what."""
    event = (chain.pre or chain.post or chain.around)[0].event  # "pre-loss": the join point's "loss"
    event = event.split("-", 1)[1] if "-" in event else event
    return repr(event) + (f" on {chain.tp.__qualname__}" if isinstance(chain.tp, type) else "")


def _around_code(around: tuple[Any, ...], seen: list[str], keywords: list[str],
                 ns: dict[str, Any]) -> list[str]:
    """A runner's lines calling its around advice (none filtered) with the call's
    positional arguments ``seen`` and ``keywords`` ("name=local"), and setting
    ``result``: ``_rules.call_around``'s work, planned (its mirror). Each advice's ``proceed`` is a
    closure taking the call's positional arguments in slots, as a dispatch
    function does, and calls the next advice (or the function) with what it got."""
    pass_obj = around[0].pass_obj
    ns["TWICE"], ns["NOT_PASSED"] = _proceed_twice, NOT_PASSED
    slots = [f"p{i}" for i in range(len(seen))]
    params = "".join(f"{slot}=NOT_PASSED, " for slot in slots) + ("/, " if slots else "")
    missing = f" or {slots[-1]} is NOT_PASSED" if slots else ""
    lines: list[str] = []
    for i, step in enumerate(around):
        ns[f"SA{i}"], ns[f"FA{i}"] = step, step.fn
    for i in range(len(around)):
        inner = i + 1 < len(around)
        target = f"FA{i + 1}" if inner else "func"
        lead = ("obj, " if pass_obj else "") + (f"proceed{i + 1}, " if inner else "")
        lines += [
            f"called{i} = 0",  # then 1 (called), or 2 once its advice returned (errors.PROCEED_*)
            f"raised{i} = None",
            f"def proceed{i}({params}*args, **kwargs):",
            f"    nonlocal called{i}, raised{i}{f', called{i + 1}' if inner else ''}",
            f"    if called{i}: raise TWICE(SA{i}, called{i})",  # at most once, during its call
            f"    called{i} = 1",
            "    try:",
            f"        if args or kwargs{missing}:",
            f"            return {target}({lead}*({_packed(slots)}), **kwargs)",
            f"        return {target}({lead}{', '.join(slots)})",
            "    except BaseException as e:",
        ]
        if inner:  # the inner advice's own error is its to note
            lines.append(f"        if e is not raised{i + 1}: NOTE(e, SA{i + 1}.label, SA{i + 1}.event)")
        lines += [f"        raised{i} = e", "        raise"]  # passed through: not advice i's
        if inner:  # advice i + 1 returned: a proceed it kept is no use now
            lines += ["    finally:", f"        if not called{i + 1}: called{i + 1} = 2"]
    lines += [
        "try:",
        f"    result = FA0({'obj, ' if pass_obj else ''}proceed0{''.join(', ' + arg for arg in seen + keywords)})",
        "except BaseException as e:",
        "    if e is not raised0: NOTE(e, SA0.label, SA0.event)",
        "    raise",
        "finally:",
        "    if not called0: called0 = 2",
    ]
    return lines


def _packed(slots: list[str]) -> str:
    """The arguments a call passed by position, as a tuple: the slots up to the
    first one not passed, then ``args`` (those past the slots)."""
    return " else ".join(
        f"({', '.join(slots[:i + 1])},) + args if {slot} is not NOT_PASSED"
        for i, slot in reversed(list(enumerate(slots)))) + (" else args" if slots else "args")



def emit_runner(steps: tuple[EmitStep, ...]) -> Callable[..., None]:
    """``run(target, name, kwargs)``: the steps of one call shape as straight-line
    code (see runner; the mirror of ``_rules.run_emit_steps``), each listener
    called with the keywords it takes, named one by one (cheaper than ``**kwargs``, which also passes them all)."""
    ns: dict[str, Any] = {"NOTE": _note_callback, "RETURNED": _emit_return_error, "STOP": StopTraining,
                          "FINISH": finish_emit}
    body: list[str] = []
    for i, (fn, gate, take, names, label) in enumerate(steps):
        ns[f"F{i}"], ns[f"G{i}"], ns[f"L{i}"] = fn, gate, label
        passed = "".join(f", {key}=kwargs[{key!r}]" for key in names)  # names: all it takes
        ns[f"R{i}"] = steps[i + 1:]
        block = [
            "try:",
            f"    r = F{i}(target{passed})",
            "except STOP as e:",  # the other listeners first, then it (finish_emit)
            f"    NOTE(e, L{i}, name)",
            f"    FINISH(e, R{i}, target, name, kwargs)",
            "except BaseException as e:",
            f"    NOTE(e, L{i}, name)",
            "    raise",
            f"if r is not None: raise RETURNED(L{i}, name, r)",
        ]
        if gate is not None:
            block = [f"if G{i}.admit(target):"] + ["    " + line for line in block]
        body += block
    source = "def run(target, name, kwargs):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
    listeners = ", ".join(step.label for step in steps)
    return cast(Callable[..., None], _define(source, f"emit runner of {listeners or 'no listener'}", ns, "run"))
