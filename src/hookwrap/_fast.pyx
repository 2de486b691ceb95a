# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Per-call dispatch, compiled: the kernel. Same names (``_dispatch.TWIN_NAMES``) and
behaviour as ``_fast_py.py``; what a plan is made of, and the rules of a call
(the return contract, around advice, the emit loop), are ``_rules``', which the
code here mirrors in C where it says so.

What makes it fast:

* ``JoinPoint`` is a method descriptor with vectorcall (the flags CPython's own
  functions carry), so ``obj.step(batch)`` calls it directly with ``obj`` as
  first argument: no bound object per lookup, no argument tuple.
* A call with nothing registered does: one type check against a cached chain,
  one version compare (and, once some instance of the class holds callbacks,
  one read of the object's own attribute), then a vectorcall of the wrapped
  function with the caller's own argument array.
* Callbacks are called with a C array of arguments (vectorcall), following a
  plan (``Step``/``ArgRef``) built at registration.

Keep it in step with ``_fast_py.py``: the same test suite runs on both.
"""

cimport cython
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF, Py_REFCNT, Py_XDECREF
from cpython.dict cimport PyDict_GetItem
from cpython.unicode cimport PyUnicode_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.sequence cimport PySequence_Fast_ITEMS
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE

from inspect import iscoroutinefunction as _iscoroutinefunction
from types import MethodType

from ._rules import MAX_CALL_SHAPES  # the bound on plans per chain or event (see there)
from ._rules import MISSING, RECORD_ATTR, STATE_KEY
from ._rules import step_slots as _step_slots
# The rules this module mirrors in C, and calls on its error paths (never the pure twin).
from ._rules import emitter as _pure_emitter
from ._rules import finish_emit as _finish_emit
from ._rules import finish_phase

from .errors import note_callback as _note_callback
from ._rules import emit_return_error as _emit_return_error
from ._rules import check_var_value as _check_var_value
from ._rules import missing_argument as _missing_argument
from ._rules import proceed_twice as _proceed_twice
from ._rules import return_error as _return_error
from .errors import StopTraining as _StopTraining

cdef extern from "Python.h":
    object PyMethod_New(object func, object self)
    object PyObject_Vectorcall(object callable, PyObject **args, size_t nargsf, PyObject *kwnames)
    object PyVectorcall_Call(object callable, object tuple, object dict)
    Py_ssize_t PyVectorcall_NARGS(size_t nargsf)
    size_t PY_VECTORCALL_ARGUMENTS_OFFSET

cdef extern from *:
    """
    /* Give a static extension type vectorcall (the function pointer at
       ``offset`` in each instance) and, with ``binds``, the calling convention of
       CPython's own functions: LOAD_METHOD calls it unbound with the instance as
       first argument (no bound method object built). */
    static void hookwrap_enable_vectorcall(PyTypeObject *t, Py_ssize_t offset, int binds) {
        t->tp_flags |= Py_TPFLAGS_HAVE_VECTORCALL | (binds ? Py_TPFLAGS_METHOD_DESCRIPTOR : 0);
        t->tp_vectorcall_offset = offset;
        PyType_Modified(t);
    }

    /* Put a Python function in a static type's dictionary without touching the
       slot of that name: Python-level tools that read the dictionary (Dynamo,
       which traces Python only) find the function; calls keep the C slot. */
    static int hookwrap_set_type_dict_item(PyTypeObject *t, PyObject *name, PyObject *value) {
        if (t->tp_dict == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "hookwrap: this type has no dictionary");
            return -1;
        }
        if (PyDict_SetItem(t->tp_dict, name, value) < 0) return -1;
        PyType_Modified(t);
        return 0;
    }

    /* For a call whose error the caller handles itself (see _call_step). */
    static PyObject *hookwrap_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames) {
        return PyObject_Vectorcall(callable, args, nargsf, kwnames);
    }
    static PyObject *hookwrap_steal(PyObject *o) { return o; }  /* hand over a reference */
    static int hookwrap_pending_error(void) { return -1; }  /* the error already set */

    /* The instance attribute `key` of `obj`, or None: read as
       object.__getattribute__ reads it, so no __getattr__ is called (nn.Module's
       would be, and raise, on every miss), and an object keeping its attributes
       inline (CPython 3.11+) is left so: asking for its __dict__ would build one,
       making every later attribute read on it slower, the caller's `obj.step`
       among them (3.12: ~100 instructions a call). */
    static PyObject *hookwrap_instance_attribute(PyObject *obj, PyObject *key) {
        PyObject *found = _PyObject_GenericGetAttrWithDict(obj, key, NULL, 1);
        if (found == NULL && !PyErr_Occurred()) Py_RETURN_NONE;
        return found;  /* NULL with an error set: a descriptor's own error */
    }
    """
    void hookwrap_enable_vectorcall(PyTypeObject *t, Py_ssize_t offset, int binds)
    int hookwrap_set_type_dict_item(PyTypeObject *t, object name, object value) except -1
    object hookwrap_instance_attribute(object obj, object key)
    PyObject *hookwrap_vectorcall(object callable, PyObject **args, size_t nargsf, PyObject *kwnames)
    PyObject *hookwrap_set_no_memory "PyErr_NoMemory"()  # sets MemoryError; its NULL is not checked
    object hookwrap_steal(PyObject *o)
    int hookwrap_pending_error() except -1

cdef enum:
    C_FUNCTION = 0
    C_METHOD = 1
    C_CLASSMETHOD = 2
    C_POS_ONLY = 0
    C_POS_OR_KW = 1
    C_KW_ONLY = 2
    C_VAR_POS = 3
    C_VAR_KW = 4
    C_RETURN_VALUE = 5
    C_EXCEPTION = 6
    C_PRE = 0
    C_POST = 1
    C_AROUND = 2
    C_ERROR = 3
    C_NOT_STARTED = 0
    C_STARTED = 1
    C_DONE = 2
    MAX_STACK = 32


def pinned_constants():
    """The numbers this module compiled in, by their ``_rules`` names: a test
    pins them to ``_rules`` (the one place they are written for Python)."""
    return {
        "FUNCTION": C_FUNCTION, "METHOD": C_METHOD, "CLASSMETHOD": C_CLASSMETHOD,
        "POS_ONLY": C_POS_ONLY, "POS_OR_KW": C_POS_OR_KW, "KW_ONLY": C_KW_ONLY,
        "VAR_POS": C_VAR_POS, "VAR_KW": C_VAR_KW, "RETURN_VALUE": C_RETURN_VALUE,
        "EXCEPTION": C_EXCEPTION, "PRE": C_PRE, "POST": C_POST, "AROUND": C_AROUND,
        "ERROR": C_ERROR, "MAX_CALLBACK_ARGS": MAX_STACK - 1,  # the C array also holds the object
        "SLOT_DEFAULT": SLOT_DEFAULT, "SLOT_RESULT": SLOT_RESULT,
        "NOT_STARTED": C_NOT_STARTED, "STARTED": C_STARTED, "DONE": C_DONE,
    }


# The keys the hot paths read, as C statics: a module global costs a dict lookup
# on every read where Cython caches none (CPython 3.12+, ~145 instructions).
cdef str _STATE_KEY = STATE_KEY
cdef str _RECORD_ATTR = RECORD_ATTR

# Chains come from the planner handed to each JoinPoint when it is built (its
# methods: see _rules).


@cython.final
cdef class ArgRef:
    """Where one named argument of a join point lives in a call, planned once."""

    cdef readonly int kind
    cdef readonly Py_ssize_t index
    cdef readonly object name
    cdef readonly object default
    cdef readonly object extra

    def __init__(self, int kind, Py_ssize_t index, name, default, extra):
        self.kind = kind
        self.index = index
        self.name = name
        self.default = default
        self.extra = extra

    cpdef object read(self, object args, object kwargs):
        cdef int kind = self.kind
        if kind == C_POS_OR_KW:
            if self.index < len(args):
                return args[self.index]
            return kwargs.get(self.name, self.default) if kwargs else self.default
        if kind == C_POS_ONLY:
            return args[self.index] if self.index < len(args) else self.default
        if kind == C_KW_ONLY:
            return kwargs.get(self.name, self.default) if kwargs else self.default
        if kind == C_VAR_POS:
            return tuple(args[self.index:])
        if not kwargs:
            return {}
        return {k: v for k, v in kwargs.items() if k not in self.extra}

    cpdef write(self, list args, dict kwargs, object value):
        cdef int kind = self.kind
        if kind == C_POS_OR_KW:
            if self.index < len(args):
                args[self.index] = value
            else:
                kwargs[self.name] = value
        elif kind == C_POS_ONLY:
            if self.index < len(args):
                args[self.index] = value
            else:  # positional-only and not passed: fill the gap with defaults
                args.extend(self.extra[len(args):])
                args.append(value)
        elif kind == C_KW_ONLY:
            kwargs[self.name] = value
        elif kind == C_VAR_POS:
            del args[self.index:]
            args.extend(value)
        else:
            for key in [k for k in kwargs if k not in self.extra]:
                del kwargs[key]
            kwargs.update(value)


cdef class Step


cdef int _phase_failed(tuple steps, Py_ssize_t j, object obj, PyObject **buf, Py_ssize_t nargs,
                       PyObject *kwnames, object result) except -1:
    """The callback of ``steps[j]`` (a phase of a fast plan) just raised: re-raise
    it with a note naming it; a StopTraining only after the phase's other
    callbacks ran (``_rules.run_steps``, the rule's reference, runs them). On the
    error path only: the calls that raise nothing pay nothing for it."""
    cdef Step step
    cdef Py_ssize_t i, total = nargs
    try:
        hookwrap_pending_error()  # first: nothing may run with the error still set
    except _StopTraining as exc:
        step = (<_StepShape>steps[j]).step
        _note_callback(exc, step.label, step.event)
        names = <tuple>kwnames if kwnames is not NULL else ()
        total += len(names)
        values = [<object>buf[i] for i in range(total)]
        rest = tuple([(<_StepShape>shape).step for shape in steps[j + 1:]])
        finish_phase(exc, rest, obj, values[:nargs], dict(zip(names, values[nargs:])), result)
    except BaseException as exc:
        step = (<_StepShape>steps[j]).step
        _note_callback(exc, step.label, step.event)
        raise


cdef int _emit_failed(tuple plan, Py_ssize_t index, object target, object name, PyObject **values,
                      Py_ssize_t nkw, PyObject *kwnames) except -1:
    """A listener of a custom event just raised: as _phase_failed, for listeners."""
    cdef Py_ssize_t i
    try:
        hookwrap_pending_error()
    except _StopTraining as exc:
        _note_callback(exc, (<tuple>plan[index])[4], name)
        names = <tuple>kwnames if kwnames is not NULL else ()
        _finish_emit(exc, plan[index + 1:], target, name, {names[i]: <object>values[i] for i in range(nkw)})
    except BaseException as exc:
        _note_callback(exc, (<tuple>plan[index])[4], name)
        raise


cdef inline PyObject *_call_step(Step step, object fn, object bound_to, PyObject **stack,
                                 Py_ssize_t m, Py_ssize_t nkw) noexcept:
    """Call ``fn`` with ``stack``, whose ``stack[-1]`` is ours to lend: a bound
    method puts its object there instead of copying the array. ``fn`` is
    ``step.fn``, or a bound method's function with its object ``bound_to``, put
    before the arguments here: what calling the method does, one C call fewer.
    No try block: entering one saves the handled exception, on every call.
    Returns a new reference, or NULL with the callback's error set: the caller
    handles it (_phase_failed, or _reraise_noted)."""
    cdef PyObject *kwnames = <PyObject *>step.kwnames if nkw else NULL
    cdef PyObject *result
    if bound_to is None:
        result = hookwrap_vectorcall(fn, stack, (m - nkw) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
    else:
        stack -= 1  # its slot before is not ours to lend: no ARGUMENTS_OFFSET
        stack[0] = <PyObject *>bound_to
        result = hookwrap_vectorcall(fn, stack, m + 1 - nkw, kwnames)
    return result


cdef int _reraise_noted(object label, object event) except -1:
    """Re-raise the error a callback just raised, with a note naming it."""
    try:
        hookwrap_pending_error()
    except BaseException as exc:
        _note_callback(exc, label, event)
        raise


@cython.final
cdef class Step:
    """One callback planned against one join point: what to pass, what comes back."""

    cdef readonly object fn
    cdef readonly object event
    cdef readonly object label
    cdef readonly int phase
    cdef readonly bint pass_obj
    cdef readonly tuple refs
    cdef readonly tuple kwnames
    cdef readonly object gate
    cdef readonly Py_ssize_t consumes

    def __init__(self, fn, event, label, int phase, bint pass_obj, tuple refs, tuple kwnames,
                 gate=None):
        cdef ArgRef ref
        self.fn = fn
        self.event = event
        self.label = label
        self.phase = phase
        self.pass_obj = pass_obj
        self.refs = refs
        self.kwnames = kwnames
        self.gate = gate  # a filter (every/once/when) with .admit(obj), or None
        if len(refs) + 1 > MAX_STACK:
            raise ValueError(f"a callback may take at most {MAX_STACK - 1} arguments")
        if phase == C_PRE:
            self.consumes = len(refs)
        else:
            self.consumes = 0
            for ref in refs:
                if ref.kind == C_RETURN_VALUE:
                    self.consumes += 1

    cpdef object invoke(self, object obj, object args, object kwargs, object result):
        """Call the callback with the arguments it named; return what it returned."""
        cdef PyObject *space[MAX_STACK + 1]
        cdef PyObject **stack = space + 1  # space[0]: see _call_step
        cdef Py_ssize_t n = 0, i
        cdef Py_ssize_t nkw = len(self.kwnames)
        cdef ArgRef ref
        cdef object value
        cdef PyObject *called
        try:
            if self.pass_obj:
                Py_INCREF(obj)
                stack[0] = <PyObject *>obj
                n = 1
            for ref in self.refs:
                value = result if ref.kind >= C_RETURN_VALUE else ref.read(args, kwargs)
                if value is MISSING:
                    raise _missing_argument(self, ref)
                Py_INCREF(value)
                stack[n] = <PyObject *>value
                n += 1
            called = _call_step(self, self.fn, None, stack, n, nkw)
            if called is NULL:
                _reraise_noted(self.label, self.event)
            return hookwrap_steal(called)
        finally:
            for i in range(n):
                Py_XDECREF(stack[i])

    cpdef object absorb(self, object obj, list args, dict kwargs, object raw, object result):
        """Apply what the callback returned (the return contract); returns the result.
        The mirror of ``_rules.absorb``."""
        cdef Py_ssize_t n
        cdef ArgRef ref
        if self.phase == C_ERROR:
            if raw is not None:
                raise _return_error(self, raw, ())
            return result
        if self.phase == C_POST:
            if self.consumes:
                if raw is None and result is not None:
                    raise _return_error(self, raw, ("return_value",))
                return raw
            if raw is not None:
                raise _return_error(self, raw, ())
            return result
        n = self.consumes
        if n == 0:
            if raw is not None:
                raise _return_error(self, raw, ())
        elif n == 1:
            ref = <ArgRef>self.refs[0]
            if raw is None and ref.read(args, kwargs) is not None:
                raise _return_error(self, raw, (ref.name,))
            if ref.kind >= C_VAR_POS:
                _check_var_value(self, ref, raw)
            ref.write(args, kwargs, raw)
        else:
            if type(raw) is not tuple or len(<tuple>raw) != n:
                raise _return_error(self, raw, tuple([r.name for r in self.refs]))
            for ref, value in zip(self.refs, raw):
                if value is None and ref.read(args, kwargs) is not None:
                    raise _return_error(self, raw, tuple([r.name for r in self.refs]))
                if ref.kind >= C_VAR_POS:
                    _check_var_value(self, ref, value)
            for ref, value in zip(self.refs, raw):
                ref.write(args, kwargs, value)
        return result


@cython.final
cdef class Chain:
    """The ordered callbacks of one event for one class (or instance).

    ``valid`` is cleared when a registration changes what it would hold: a call
    that finds it cleared asks its planner for a new one. ``base``: for an
    instance's chain, the class chain it extends (stale once that is replaced).
    """

    cdef readonly object tp
    cdef public bint valid
    cdef readonly object base
    cdef readonly bint fire
    cdef readonly tuple pre
    cdef readonly tuple post
    cdef readonly tuple around
    cdef readonly tuple error
    cdef readonly bint empty
    cdef readonly bint check_state
    cdef readonly bint passthrough
    cdef object _pure  # a pure copy of its steps, for torch.compile (see traced)
    cdef readonly bint read_by_trace
    cdef _ShapePlan shape  # the plan for the last call shape seen (fast path)
    cdef dict shapes  # the first MAX_CALL_SHAPES call shapes seen: (nargs, keyword names) -> plan

    def __init__(self, tp, bint fire, tuple pre, tuple post,
                 tuple around=(), tuple error=(), bint check_state=True, base=None):
        self.tp = tp
        self.valid = True
        self.base = base
        self.fire = fire  # False when a subclass overrides this join point (super() call)
        self.pre = pre
        self.post = post
        self.around = around
        self.error = error
        self.empty = not (pre or post or around or error)
        # Could an instance of `tp` hold callbacks of its own? (its ClassRecord knows)
        self.check_state = check_state
        # The one check a call makes when nothing can run.
        self.passthrough = not fire or (self.empty and not check_state)
        self._pure = None
        self.read_by_trace = False
        self.shapes = {}

    property traced:
        """Its steps as the pure twin's objects, which Dynamo can trace (_traced),
        copied on first use. Dynamo calls this getter for real while it traces, so
        the copy is made outside the trace, and the mark it leaves tells a
        registration that dropped this chain to build it again at once."""
        def __get__(self):
            self.read_by_trace = True
            if self._pure is None:
                self._pure = _pure_copy(self)
            return self._pure


# --- The fast path: one plan per call shape ------------------------------------
#
# For a chain of pre/post callbacks and around advice (the common case), the argument each
# callback asks for sits at a fixed place in the caller's argument array once
# the call's shape (how many positional arguments, which keyword names) is
# known. _ShapePlan records those places; a call then copies the caller's
# argument pointers, calls each callback with vectorcall, applies the return
# contract, writes replacements back in place, and calls the function with the
# same array (around advice: see _around_from): no list, dict or tuple built.
# Anything else (var-args, error advice, a pre callback replacing an argument
# the caller did not pass) takes the general path.

cdef enum:  # _rules.step_slots's marks
    SLOT_DEFAULT = -1
    SLOT_RESULT = -2


@cython.final
cdef class _StepShape:
    cdef Step step
    cdef object func  # step.fn, or a bound method's function, called with...
    cdef object bound_to  # ...its object in stack[-1] (None: not a bound method)
    cdef Py_ssize_t n
    cdef Py_ssize_t nkw
    cdef Py_ssize_t slots[MAX_STACK]
    cdef tuple defaults
    cdef tuple names


@cython.final
cdef class _ShapePlan:
    cdef bint fit
    cdef Py_ssize_t nargs
    cdef object kwnames
    cdef tuple pre
    cdef tuple post
    cdef tuple around  # None: no around advice
    cdef Py_ssize_t skip  # leading arguments around advice does not see (the object)


cdef _ShapePlan _UNPLANNED = _ShapePlan.__new__(_ShapePlan)  # not fit: the general path
_UNPLANNED.fit = False


cdef _ShapePlan _plan_shape(Chain chain, Py_ssize_t nargs, object kwnames):
    cdef _ShapePlan plan = _ShapePlan.__new__(_ShapePlan)
    cdef _StepShape shape
    cdef Step step
    cdef Py_ssize_t i
    cdef tuple names = kwnames if kwnames is not None else ()
    plan.nargs = nargs
    plan.kwnames = kwnames
    plan.fit = False
    if chain.error or nargs + len(names) + 2 > MAX_STACK:  # around adds [obj, proceed]
        return plan
    shaped = {}
    for phase, steps in ((C_PRE, chain.pre), (C_POST, chain.post)):
        out = []
        for step in steps:
            shape = _StepShape.__new__(_StepShape)
            shape.step = step
            if type(step.fn) is MethodType:  # a Callback's: call its function as CPython would
                shape.func = step.fn.__func__
                shape.bound_to = step.fn.__self__
            else:
                shape.func = step.fn
                shape.bound_to = None
            shape.n = len(step.refs)
            shape.nkw = len(step.kwnames)
            slots = _step_slots(step, phase, nargs, names)
            if slots is None:
                return plan  # the general path
            for i in range(shape.n):
                shape.slots[i] = slots[i]
            shape.defaults = tuple([r.default for r in step.refs])
            shape.names = tuple([r.name for r in step.refs])
            out.append(shape)
        shaped[phase] = tuple(out)
    plan.pre = shaped[C_PRE]
    plan.post = shaped[C_POST]
    if chain.around:
        plan.around = chain.around
        plan.skip = 1 if (<Step>chain.around[0]).pass_obj else 0
    plan.fit = True
    return plan


cdef inline Py_ssize_t _fill_stack(_StepShape shape, PyObject **stack, object obj, PyObject **buf,
                                   object result) noexcept:
    cdef Py_ssize_t m = 0, i, slot
    if shape.step.pass_obj:
        stack[0] = <PyObject *>obj
        m = 1
    for i in range(shape.n):
        slot = shape.slots[i]
        if slot >= 0:
            stack[m] = buf[slot]
        elif slot == SLOT_RESULT:
            stack[m] = <PyObject *>result
        else:
            stack[m] = <PyObject *>(<tuple>shape.defaults)[i]
        m += 1
    return m


cdef inline unsigned long long _store(PyObject **buf, unsigned long long owned, Py_ssize_t slot,
                                     object value):
    """Put a replacement in ``buf[slot]``, holding a reference (bit ``slot`` of ``owned``)."""
    Py_INCREF(value)
    if owned & (1ULL << slot):
        Py_XDECREF(buf[slot])
    buf[slot] = <PyObject *>value
    return owned | (1ULL << slot)


cdef object _run_fast(_ShapePlan plan, object func, object obj, PyObject **args,
                      Py_ssize_t nargs, PyObject *kwnames):
    cdef PyObject *buf[MAX_STACK]
    cdef PyObject *space[MAX_STACK + 1]
    cdef PyObject **stack = space + 1  # space[0]: see _call_step
    cdef unsigned long long owned = 0  # bit i: buf[i] is a reference we hold
    cdef Py_ssize_t total = nargs, i, m, slot, n
    cdef Py_ssize_t j
    cdef tuple steps
    cdef _StepShape shape
    cdef Step step
    cdef object raw, result = None
    cdef PyObject *called
    if kwnames is not NULL:
        total += len(<tuple>kwnames)
    for i in range(total):
        buf[i] = args[i]
    try:
        # Indexed, with unchecked casts: a for loop over a tuple type-tests each item.
        steps = plan.pre
        for j in range(PyTuple_GET_SIZE(steps)):
            shape = <_StepShape>PyTuple_GET_ITEM(steps, j)
            step = shape.step
            if step.gate is not None and not step.gate.admit(obj):
                continue
            m = _fill_stack(shape, stack, obj, buf, None)
            called = _call_step(step, shape.func, shape.bound_to, stack, m, shape.nkw)
            if called is NULL:
                _phase_failed(steps, j, obj, buf, nargs, kwnames, None)
            raw = hookwrap_steal(called)
            n = shape.n  # the return contract for a pre step, planned: mirrors _rules.absorb
            if n == 0:
                if raw is not None:
                    raise _return_error(step, raw, ())
                continue
            if n == 1:
                slot = shape.slots[0]
                if raw is None and buf[slot] != <PyObject *>None:
                    raise _return_error(step, raw, shape.names)
                owned = _store(buf, owned, slot, raw)
                continue
            if type(raw) is not tuple or len(<tuple>raw) != n:
                raise _return_error(step, raw, shape.names)
            for i in range(n):
                if (<tuple>raw)[i] is None and buf[shape.slots[i]] != <PyObject *>None:
                    raise _return_error(step, raw, shape.names)
            for i in range(n):
                owned = _store(buf, owned, shape.slots[i], (<tuple>raw)[i])
        if plan.around is None:
            result = PyObject_Vectorcall(func, buf, nargs, kwnames)
        else:
            result = _around_from(plan.around, 0, func, obj, buf + plan.skip, nargs - plan.skip,
                                  kwnames, None)
        steps = plan.post
        for j in range(PyTuple_GET_SIZE(steps)):
            shape = <_StepShape>PyTuple_GET_ITEM(steps, j)
            step = shape.step
            if step.gate is not None and not step.gate.admit(obj):
                continue
            m = _fill_stack(shape, stack, obj, buf, result)
            called = _call_step(step, shape.func, shape.bound_to, stack, m, shape.nkw)
            if called is NULL:
                _phase_failed(steps, j, obj, buf, nargs, kwnames, result)
            raw = hookwrap_steal(called)
            result = step.absorb(obj, None, None, raw, result)  # post: arguments untouched
        return result
    finally:
        if owned:
            for i in range(total):
                if owned & (1ULL << i):
                    Py_XDECREF(buf[i])


cdef class HookState:
    """Per-instance hook state: the instance's own attribute ``STATE_KEY`` (see _instances)."""

    cdef public dict chains
    cdef public dict emit_cache  # custom event -> EmitEvent (see emit)
    cdef object last_jp  # the join point of the last chain served, and that chain:
    cdef Chain last_chain  # a call on the same join point skips the chains dict

    def __cinit__(self, *args, **kwargs):
        self.chains = {}
        self.emit_cache = {}

    cpdef Chain chain_for(self, JoinPoint jp, Chain type_chain):
        cdef PyObject *cached = PyDict_GetItem(self.chains, jp)
        if cached is not NULL and (<Chain>cached).valid and (<Chain>cached).base is type_chain:
            chain = <Chain>cached
        else:
            chain = jp.planner.instance_chain(self, jp, type_chain)
            self.chains[jp] = chain
        self.last_jp = jp
        self.last_chain = chain
        return chain

    def forget_last_chain(self):
        """Drop the last-chain cache (its chain was dropped: let it be freed)."""
        self.last_jp = None
        self.last_chain = None


cdef Chain _NO_CHAIN = Chain(MISSING, False, (), ())
_NO_CHAIN.valid = False


cdef Chain _instance_chain(JoinPoint jp, object obj, Chain chain):
    """The chain of ``obj``'s own callbacks, which extends ``chain``, its class's;
    ``chain`` where it holds none. (Its own function: the references it holds
    would cost every call of the join point their set-up.)"""
    cdef HookState hooks
    state = hookwrap_instance_attribute(obj, _STATE_KEY)
    if state is None:
        return chain
    hooks = <HookState>state
    if hooks.last_jp is jp and hooks.last_chain.valid and hooks.last_chain.base is chain:
        return hooks.last_chain
    return hooks.chain_for(jp, chain)


cdef object _join_point_vectorcall(JoinPoint self, PyObject **args, size_t nargsf,
                                   PyObject *kwnames):
    cdef Py_ssize_t nargs = PyVectorcall_NARGS(nargsf)
    # Borrowed: the caller holds its arguments, and an object its type.
    cdef PyObject *obj
    cdef PyObject *tp
    cdef Chain chain
    if self.binding == C_FUNCTION:
        obj = <PyObject *>None
        tp = <PyObject *>self.owner
    elif nargs > 0:
        obj = args[0]
        tp = obj if self.binding == C_CLASSMETHOD else <PyObject *>Py_TYPE(<object>obj)
    else:  # called unbound without an object: let Python report it
        return PyObject_Vectorcall(self.func, args, nargsf, kwnames)
    chain = self._chain
    if <PyObject *>chain.tp is not tp or not chain.valid:
        chain = self.planner.type_chain(self, <object>tp)
        self._chain = chain
    if chain.passthrough:
        return PyObject_Vectorcall(self.func, args, nargsf, kwnames)
    if chain.check_state:
        chain = _instance_chain(self, <object>obj, chain)
    if chain.empty:
        return PyObject_Vectorcall(self.func, args, nargsf, kwnames)
    if self.guard is not None:
        return _run_guarded(self, chain, <object>obj, args, nargs, kwnames)
    return _run_chain(self, chain, self.func, <object>obj, args, nargs, kwnames)


cdef class _Recorder  # defined below, after its base


cdef object _run_guarded(JoinPoint self, Chain chain, object obj, PyObject **args, Py_ssize_t nargs,
                         PyObject *kwnames):
    """_fast_py._run_guarded in C: the chain around a recorder of the function; a
    StopTraining goes to the guard's ``stopped``, with how far the function got and
    the call's own arguments; ``changed`` hears of a result the callbacks replaced."""
    cdef _Recorder recorder
    cdef Py_ssize_t i
    guard = self.guard
    if guard.admit is not None and not guard.admit(obj):
        return PyObject_Vectorcall(self.func, args, nargs, kwnames)
    recorder = _Recorder.__new__(_Recorder)
    recorder.func = self.func
    try:
        result = _run_chain(self, chain, recorder, obj, args, nargs, kwnames)
    except _StopTraining as exc:
        given = tuple([<object>args[i] for i in range(nargs)])
        given_kwargs = {}
        if kwnames is not NULL:
            for i in range(len(<tuple>kwnames)):
                given_kwargs[(<tuple>kwnames)[i]] = <object>args[nargs + i]
        return guard.stopped(obj, exc, recorder.ran, recorder.result, given, given_kwargs)
    if guard.changed is not None and recorder.ran == C_DONE and result is not recorder.result:
        guard.changed(obj, recorder.result, result)
    return result


cdef object _run_chain(JoinPoint self, Chain chain, object func, object obj, PyObject **args,
                       Py_ssize_t nargs, PyObject *kwnames):
    """Run ``chain`` around the call of ``func``. (Its own function: the references
    it holds would cost the calls with nothing to run their set-up.)"""
    cdef Py_ssize_t i, nkw
    cdef _ShapePlan plan
    cdef list call_args
    cdef dict call_kwargs
    if self.run_wrapped is None:
        plan = chain.shape
        names = <object>kwnames if kwnames is not NULL else None
        if plan is None or plan.nargs != nargs or (plan.kwnames is not names and plan.kwnames != names):
            # Another call shape: plan it once, and keep it for callers that alternate.
            key = (nargs, names)
            plan = chain.shapes.get(key)
            if plan is None and len(chain.shapes) < MAX_CALL_SHAPES:
                plan = chain.shapes[key] = _plan_shape(chain, nargs, names)
            if plan is not None:
                chain.shape = plan
            else:  # a shape past MAX_CALL_SHAPES: the general path, keeping nothing
                plan = _UNPLANNED
        if plan.fit:
            return _run_fast(plan, func, obj, args, nargs, kwnames)
    # Callbacks to run: take the arguments into a list and a dict they may rewrite.
    call_args = [<object>args[i] for i in range(nargs)]
    call_kwargs = {}
    if kwnames is not NULL:
        nkw = len(<tuple>kwnames)
        for i in range(nkw):
            call_kwargs[(<tuple>kwnames)[i]] = <object>args[nargs + i]
    if self.run_wrapped is not None:  # a coroutine or generator: the chain runs inside it
        return self.run_wrapped(chain, func, obj, call_args, call_kwargs)
    return _run_owned(chain, func, obj, call_args, call_kwargs)


cdef class _Vectorcalled:
    """A callable whose calls take its ``vectorcall`` function (set in each
    subclass's ``__cinit__``; see hookwrap_enable_vectorcall)."""

    cdef void *vectorcall

    def __call__(self, *args, **kwargs):
        return PyVectorcall_Call(self, args, kwargs)


cdef _Vectorcalled _probe = _Vectorcalled.__new__(_Vectorcalled)
cdef Py_ssize_t _VECTORCALL_OFFSET = <char *>&_probe.vectorcall - <char *><PyObject *>_probe
_probe = None


cdef class _BindsLikeAFunction(_Vectorcalled):
    """A vectorcall callable that binds to an instance as a function does."""

    def __get__(self, obj, cls):
        if obj is None:
            return self
        return PyMethod_New(self, obj)


@cython.final
cdef class _Recorder(_Vectorcalled):
    """What a guarded join point's chain calls in place of its function: calls it,
    and keeps how far it got and what it returned, for the guard."""

    cdef object func
    cdef int ran
    cdef object result

    def __cinit__(self, *args, **kwargs):
        self.vectorcall = <void *>_recorder_vectorcall
        self.ran = C_NOT_STARTED


cdef object _recorder_vectorcall(_Recorder self, PyObject **args, size_t nargsf, PyObject *kwnames):
    self.ran = C_STARTED
    result = PyObject_Vectorcall(self.func, args, nargsf, kwnames)
    self.ran = C_DONE
    self.result = result
    return result


@cython.final
cdef class JoinPoint(_BindsLikeAFunction):
    """A hookable function or method: a descriptor that dispatches its callbacks."""

    cdef public object func
    cdef public object event
    cdef public bint explicit_event
    cdef public int binding
    cdef public object owner
    cdef public object attr_name
    cdef public bint is_async
    cdef public object run_wrapped  # see the planner's wrapped_runner
    cdef public object guard  # _rules.Guard: what runs around its callbacks, when they run
    cdef public object planner
    cdef public object spec  # its parameters, read once (signature.JoinPointSpec)
    cdef public object record  # registrations on this function itself (_owners.Record)
    cdef Chain _chain  # the chain of the last class it ran for
    cdef dict __dict__
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self.vectorcall = <void *>_join_point_vectorcall
        self._chain = _NO_CHAIN

    def __init__(self, func, event, int binding, planner):
        self.func = func
        # Event name: the explicit one, else the attribute name in the class
        # (__set_name__), else the function's __name__.
        self.explicit_event = event is not None
        self.event = event if event is not None else getattr(func, "__name__", "?")
        self.binding = binding
        self.owner = None
        self.attr_name = None
        self.is_async = _iscoroutinefunction(func)
        self.run_wrapped = planner.wrapped_runner(func)
        self.planner = planner

    def forget_last_chain(self):
        """Drop the one-entry cache (it holds its class strongly; see _chains)."""
        self._chain = _NO_CHAIN

    def listened(self, obj):
        """Would a call of this method on ``obj`` run callbacks? (A mirror of the
        chain lookup of _join_point_vectorcall, as _fast_py's.)"""
        cdef Chain chain = self._chain
        tp = type(obj)
        if chain.tp is not tp or not chain.valid:
            chain = self.planner.type_chain(self, tp)
            self._chain = chain
        if chain.passthrough:
            return False
        if chain.check_state:
            chain = _instance_chain(self, obj, chain)
        return not chain.empty

    def __set_name__(self, owner, name):
        self.owner = owner
        self.attr_name = name
        if not self.explicit_event:
            self.event = name
        if self.binding == C_FUNCTION:  # defined in a class body: an instance method
            self.binding = C_METHOD
        self.planner.named(self, owner, name)  # on an nn.Module: what Dynamo can trace

    def __reduce__(self):
        # Pickle by reference, like the function it wraps.
        return self.__qualname__

    def __repr__(self):
        # As the function it stands for reads, and the pure twin's (a function).
        return f"<function {getattr(self, '__qualname__', self.event)} at {id(self):#x}>"


def as_attribute(JoinPoint jp):
    """What to store in a class or module for ``jp``: the join point itself."""
    return jp


hookwrap_enable_vectorcall(<PyTypeObject *>JoinPoint, _VECTORCALL_OFFSET, True)
hookwrap_enable_vectorcall(<PyTypeObject *>_Recorder, _VECTORCALL_OFFSET, False)


cdef object _pure_copy = None  # _traced.pure_chain, handed in by show_python_twins


def show_python_twins(get, call, pure_copy, emit_get, emit_call):
    """Give ``JoinPoint.__get__`` and ``JoinPoint.__call__`` Python twins, for
    Dynamo to trace, and ``Chain.traced`` its copier; likewise the ``emit``
    object's (see _traced). The C slots still serve every call."""
    global _pure_copy
    _pure_copy = pure_copy
    hookwrap_set_type_dict_item(<PyTypeObject *>JoinPoint, "__get__", get)
    hookwrap_set_type_dict_item(<PyTypeObject *>JoinPoint, "__call__", call)
    hookwrap_set_type_dict_item(<PyTypeObject *>_Emitter, "__get__", emit_get)
    hookwrap_set_type_dict_item(<PyTypeObject *>_Emitter, "__call__", emit_call)


cdef object _run_owned(Chain chain, object func, object obj, list args, dict kwargs):
    if not chain.error:
        return _run_main(chain, func, obj, args, kwargs)
    try:
        return _run_main(chain, func, obj, args, kwargs)
    except Exception as exc:
        _run_error_steps(chain, obj, args, kwargs, exc)
        raise


cdef object _run_phase(tuple steps, object obj, list args, dict kwargs, object result):
    """_rules.run_steps in C: a StopTraining goes to finish_phase (the phase's
    other callbacks, then it), from inside its handler, as every path does."""
    cdef Step step
    cdef Py_ssize_t j
    for j in range(PyTuple_GET_SIZE(steps)):
        step = <Step>PyTuple_GET_ITEM(steps, j)
        if step.gate is None or step.gate.admit(obj):
            try:
                raw = step.invoke(obj, args, kwargs, result)
            except _StopTraining as exc:
                finish_phase(exc, steps[j + 1:], obj, args, kwargs, result)
                raise  # finish_phase raises it: for the compiler
            result = step.absorb(obj, args, kwargs, raw, result)
    return result


cdef object _run_main(Chain chain, object func, object obj, list args, dict kwargs):
    _run_phase(chain.pre, obj, args, kwargs, None)
    if chain.around:
        # Around advice sees the call's own arguments, without the object.
        result = call_around(chain.around, 0, func, obj,
                             tuple(args[1:] if chain.around[0].pass_obj else args), kwargs)
    else:
        result = func(*args, **kwargs)
    return _run_phase(chain.post, obj, args, kwargs, result)


def _run_error_steps(Chain chain, obj, list args, dict kwargs, exc):
    if isinstance(exc, _StopTraining):  # control flow, not a failure
        return
    _run_phase(chain.error, obj, args, kwargs, exc)


# --- Around advice ------------------------------------------------------------
#
# An around callback is called with vectorcall: [obj, proceed, the call's own
# arguments], keyword names as the caller gave them. ``proceed`` is a _Proceed
# with vectorcall too, so ``proceed(batch)`` reaches the next advice or the
# function with no tuple or dict built on the way.


@cython.final
@cython.freelist(8)
cdef class _Proceed:
    """What an around callback calls to run the rest: inner advice, then the function.
    The mirror of ``_rules.Proceed`` (with ``_around_from``, of ``_rules.call_around``).
    Not a _Vectorcalled: Cython keeps a freelist only for a type with no base,
    and one is made per advice call."""

    cdef void *vectorcall
    cdef readonly tuple around
    cdef readonly Py_ssize_t index
    cdef readonly object func
    cdef readonly object obj
    cdef readonly int state  # _rules.PROCEED_FRESH, _CALLED, or _ENDED (its advice returned)
    cdef readonly object raised
    # Its vectorcall is set by _around_from, which makes every one: a __cinit__
    # would cost each ~50 instructions parsing its (empty) arguments.

    def __call__(self, *args, **kwargs):
        return PyVectorcall_Call(self, args, kwargs)


cdef _Proceed _proceed_probe = _Proceed.__new__(_Proceed)
hookwrap_enable_vectorcall(
    <PyTypeObject *>_Proceed,
    <char *>&_proceed_probe.vectorcall - <char *><PyObject *>_proceed_probe, False)
_proceed_probe = None


cdef object _proceed_vectorcall(_Proceed self, PyObject **args, size_t nargsf, PyObject *kwnames):
    if self.state:
        raise _proceed_twice(self.around[self.index], self.state)
    self.state = 1
    cdef bint pass_obj = (<Step>PyTuple_GET_ITEM(self.around, 0)).pass_obj
    if self.index + 1 == PyTuple_GET_SIZE(self.around) and (
            not pass_obj or nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET):
        return _proceed_to_function(self, pass_obj, args, nargsf, kwnames)
    return _around_from(self.around, self.index + 1, self.func, self.obj, args,
                        PyVectorcall_NARGS(nargsf), kwnames, self)


cdef object _proceed_to_function(_Proceed self, bint pass_obj, PyObject **args, size_t nargsf,
                                 PyObject *kwnames):
    """``_around_from`` with no advice left, for the innermost advice's proceed:
    the function takes the caller's arguments where they lie, with the object
    (``pass_obj``) in the slot before them, which the caller lent
    (PY_VECTORCALL_ARGUMENTS_OFFSET)."""
    cdef PyObject *result
    cdef PyObject *lent
    cdef PyObject **with_obj = args - 1  # the slot lent, then the arguments
    if not pass_obj:
        result = hookwrap_vectorcall(self.func, args, nargsf, kwnames)
    else:
        lent = with_obj[0]
        with_obj[0] = <PyObject *>self.obj
        result = hookwrap_vectorcall(self.func, with_obj, PyVectorcall_NARGS(nargsf) + 1, kwnames)
        with_obj[0] = lent
    if result is NULL:
        _reraise_from_around(None, None, self)
    return hookwrap_steal(result)


# One _Proceed, no longer referenced by the advice that had it, kept for the next
# call of around advice: a fresh one costs an allocation and its set-up.
cdef _Proceed _spare_proceed = None


cdef object _around_from(tuple around, Py_ssize_t index, object func, object obj,
                         PyObject **args, Py_ssize_t nargs, PyObject *kwnames, _Proceed caller):
    """Call around advice ``index`` (skipping filtered ones), or the function
    (the mirror of ``_rules.call_around``), with the call's own arguments ``args`` (``nargs`` positional, then the
    values of ``kwnames``). ``caller``: the proceed making this call, or None."""
    cdef Py_ssize_t n = len(around), total = nargs, i, lead
    cdef PyObject *local[MAX_STACK + 1]
    cdef PyObject **stack = local + 1  # stack[-1]: see _call_step
    cdef PyObject **spill = NULL
    cdef PyObject *result
    cdef Step step = None
    cdef _Proceed proceed = None
    global _spare_proceed
    if kwnames is not NULL:
        total += len(<tuple>kwnames)
    while index < n:
        step = around[index]
        if step.gate is None or step.gate.admit(obj):
            break
        index += 1
    if index < n:
        proceed = _spare_proceed
        if proceed is None:
            proceed = _Proceed.__new__(_Proceed)
            proceed.vectorcall = <void *>_proceed_vectorcall
        else:  # taken while in use: a nested call makes its own
            _spare_proceed = None
            proceed.state = 0
        proceed.around = around
        proceed.index = index
        proceed.func = func
        proceed.obj = obj
        lead = 2 if step.pass_obj else 1
    else:
        lead = 1 if (<Step>around[0]).pass_obj else 0
    if total + lead > MAX_STACK:
        spill = <PyObject **>PyMem_Malloc((total + lead + 1) * sizeof(PyObject *))
        if spill is NULL:
            hookwrap_set_no_memory()
            _reraise_from_around(None, None, caller)
        stack = spill + 1
    for i in range(total):
        stack[lead + i] = args[i]
    if lead:
        stack[0] = <PyObject *>obj
    if proceed is None:  # no advice left: the function
        result = hookwrap_vectorcall(func, stack, (nargs + lead) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     kwnames)
    else:
        stack[lead - 1] = <PyObject *>proceed
        result = hookwrap_vectorcall(step.fn, stack, (nargs + lead) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     kwnames)
    PyMem_Free(spill)
    if result is NULL:
        _reraise_from_around(step if proceed is not None else None, proceed, caller)
    if proceed is not None:
        if Py_REFCNT(proceed) != 1:
            # The advice kept it: once its call is over it may not run (it would
            # skip the chain, or run in another call), and it holds nothing of it.
            if not proceed.state:
                proceed.state = 2
            proceed.func = proceed.obj = proceed.raised = None
        elif _spare_proceed is None:
            # The advice kept no reference to it: keep it for the next call, holding
            # nothing of this one (its object, the function, an error passed through).
            proceed.around = proceed.func = proceed.obj = proceed.raised = None
            _spare_proceed = proceed
    return hookwrap_steal(result)


cdef int _reraise_from_around(Step step, _Proceed proceed, _Proceed caller) except -1:
    """Re-raise the error just raised by around advice ``step`` (None: by the
    function), noted with the advice unless it came through its ``proceed``,
    and kept on ``caller`` (the proceed that ran this level), for the advice
    around it to tell its own errors from those passed through."""
    if proceed is not None and not proceed.state:
        proceed.state = 2  # a proceed kept by advice that raised: its call is over
    try:
        hookwrap_pending_error()
    except BaseException as exc:
        if step is not None and exc is not proceed.raised:
            _note_callback(exc, step.label, step.event)
        if caller is not None:
            caller.raised = exc
        raise


cpdef object call_around(tuple around, Py_ssize_t index, object func, object obj,
                         tuple args, dict kwargs):
    """Call around advice ``index`` (skipping filtered ones), or the function."""
    cdef Py_ssize_t nargs = len(args), nkw = len(kwargs) if kwargs else 0, i
    cdef PyObject *local[MAX_STACK]
    cdef PyObject **flat = local
    cdef PyObject **spill = NULL
    cdef tuple kwnames = None
    cdef list values
    if nkw == 0:
        return _around_from(around, index, func, obj,
                            PySequence_Fast_ITEMS(args), nargs, NULL, None)
    kwnames = tuple(kwargs)
    values = list(kwargs.values())
    if nargs + nkw > MAX_STACK:
        spill = flat = <PyObject **>PyMem_Malloc((nargs + nkw) * sizeof(PyObject *))
        if spill is NULL:
            raise MemoryError()
    try:
        for i in range(nargs):
            flat[i] = <PyObject *>args[i]
        for i in range(nkw):
            flat[nargs + i] = <PyObject *>values[i]
        return _around_from(around, index, func, obj, flat, nargs, <PyObject *>kwnames, None)
    finally:
        PyMem_Free(spill)


# --- Custom events: obj.emit(name, **kw) and hookwrap.emit(obj, name, **kw) ----
#
# Steps are the pure twin's EmitStep tuples (read here by index), so that the
# pure twin's emit runs over this twin's plans too: it is what torch.compile's
# Dynamo traces in this object's place (_traced).
#
# One object serves both spellings: a method descriptor with vectorcall, so
# ``obj.emit("x", k=v)`` arrives as [obj, "x", v] with the call site's constant
# keyword-name tuple, the same array ``emit(obj, "x", k=v)`` passes. That tuple
# is the call shape; a listener taking every keyword gets the caller's values
# and names as they came: no dict is built.


@cython.final
cdef class EmitEvent:
    """One custom event's listeners on one owner, and its plan per call shape
    (the keyword names emitted, in order), the last one used kept at hand."""

    cdef readonly tuple listeners
    cdef readonly dict plans
    cdef readonly dict runners  # the pure twin's emit keeps its runners here (see _traced)
    cdef object last_shape
    cdef tuple last_plan

    def __init__(self, tuple listeners):
        self.listeners = listeners
        self.plans = {}
        self.runners = {}


cdef tuple _NO_KEYWORDS = ()


cdef object _emit_vectorcall(_Emitter self, PyObject **args, size_t nargsf, PyObject *kwnames):
    cdef Py_ssize_t nargs = PyVectorcall_NARGS(nargsf)
    cdef Py_ssize_t nkw = 0
    cdef PyObject *found = NULL
    cdef object target, name, tp, shape, state
    cdef object cache = None
    cdef EmitEvent event
    cdef tuple plan
    if nargs != 2:  # a malformed call: the twin reports it as Python would
        return PyObject_Vectorcall(self.twin, args, nargsf, kwnames)
    if kwnames is not NULL:
        nkw = len(<tuple>kwnames)
    target = <object>args[0]
    name = <object>args[1]
    if isinstance(target, type):
        tp = target
    else:
        tp = type(target)
        state = hookwrap_instance_attribute(target, _STATE_KEY)
        if state is not None:
            cache = (<HookState>state).emit_cache
    if cache is None and (<PyTypeObject *>tp).tp_dict is not NULL:  # NULL: a static type (3.12+)
        found = PyDict_GetItem(<object>(<PyTypeObject *>tp).tp_dict, _RECORD_ATTR)
        if found is not NULL:
            cache = getattr(<object>found, "emit_cache")
    # Only an exact str is looked up here: another name (unhashable, or a str subclass
    # whose __hash__ raises) goes to the planner, which refuses or normalizes it.
    found = PyDict_GetItem(cache, name) if cache is not None and PyUnicode_CheckExact(name) else NULL
    if found is not NULL:
        event = <EmitEvent>found
    else:
        event = self.planner.gather(target, tp, name)
    shape = <object>kwnames if kwnames is not NULL else _NO_KEYWORDS
    if event.last_shape is shape:
        plan = event.last_plan
    else:
        plan = event.plans.get(shape)
        if plan is None:
            plan = self.planner.plan(event, shape, tp, name)
        event.last_shape = shape
        event.last_plan = plan
    if not plan:
        return None
    if nkw < MAX_STACK:
        _run_emit(plan, target, name, args + 2, nkw, kwnames)
        return None
    cdef PyObject **spill = <PyObject **>PyMem_Malloc(2 * (nkw + 2) * sizeof(PyObject *))
    if spill is NULL:
        raise MemoryError()
    try:  # two arrays of nkw + 1, each after a slot to lend (see _call_step)
        _run_emit_with(plan, target, name, args + 2, nkw, kwnames, spill + 1, spill + nkw + 3)
    finally:
        PyMem_Free(spill)
    return None


cdef inline int _run_emit(tuple plan, object target, object name, PyObject **values,
                          Py_ssize_t nkw, PyObject *kwnames) except -1:
    cdef PyObject *stack[MAX_STACK + 1]
    cdef PyObject *picked[MAX_STACK + 1]
    return _run_emit_with(plan, target, name, values, nkw, kwnames, stack + 1, picked + 1)


cdef int _run_emit_with(tuple plan, object target, object name, PyObject **values,
                        Py_ssize_t nkw, PyObject *kwnames, PyObject **stack,
                        PyObject **picked) except -1:
    """Call each listener of ``plan`` (the mirror of ``_rules.run_emit_steps``):
    with the caller's keywords as they came
    (``stack``), or with the ones it takes, gathered in ``picked`` (each array
    with a slot to lend before it: see _call_step)."""
    cdef Py_ssize_t i, n
    cdef tuple step  # an EmitStep (a tuple subclass): fn, gate, take, names, label
    cdef PyObject *result
    cdef object raw, gate, take, entry
    cdef Py_ssize_t index = -1
    stack[0] = <PyObject *>target
    for i in range(nkw):
        stack[i + 1] = values[i]
    for entry in plan:
        index += 1
        step = <tuple>entry
        gate = step[1]
        if gate is not None and not gate.admit(target):
            continue
        take = step[2]
        if take is None:
            result = hookwrap_vectorcall(step[0], stack, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
        else:
            picked[0] = <PyObject *>target
            n = len(<tuple>take)
            for i in range(n):
                picked[i + 1] = stack[<Py_ssize_t>(<tuple>take)[i] + 1]
            result = hookwrap_vectorcall(step[0], picked, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                         <PyObject *>step[3] if n else NULL)
        if result is NULL:
            _emit_failed(plan, index, target, name, values, nkw, kwnames)
        raw = hookwrap_steal(result)
        if raw is not None:
            raise _emit_return_error(step[4], name, raw)
    return 0


@cython.final
cdef class _Emitter(_BindsLikeAFunction):
    """``emit(target, name, /, **kwargs)``: call the callbacks of custom event
    ``name`` on ``target``, each with the keywords it names. Also stored as
    ``Hookable.emit``, where it binds like a method."""

    cdef readonly object planner  # see _rules.emitter
    cdef readonly object twin  # the pure twin's emit: see emitter
    cdef dict __dict__

    def __cinit__(self, *args, **kwargs):
        self.vectorcall = <void *>_emit_vectorcall

    def __init__(self, planner, twin):
        self.planner = planner
        self.twin = twin
        for attr in ("__name__", "__qualname__", "__module__", "__doc__"):
            setattr(self, attr, getattr(twin, attr))
        self.__wrapped__ = twin  # inspect.signature reads the twin's


hookwrap_enable_vectorcall(<PyTypeObject *>_Emitter, _VECTORCALL_OFFSET, True)


def emitter(planner):
    """The ``emit`` function: compiled, with the pure twin's behind it to report
    a malformed call as Python would, and for Dynamo to trace."""
    return _Emitter(planner, _pure_emitter(planner))
