"""Which turn of which loop a thread is on: what lines up one thread's access with another's.

The 32 threads of a warp run one instruction together. In a loop, the k-th turn of every
thread still in the loop runs together, even where a thread skipped the access on an earlier
turn (an `if` inside the loop): so the n-th time a thread makes an access is not enough to say
which warp request it joins. A traced launch therefore runs a copy of the kernel (and of its
device functions) in which every `for` and `while` statement tells the running thread when it
starts and when it goes round again. An access then carries a `path`:

    (the caller's path or None, (turns of each loop around the access's line, outermost first))

Two threads' accesses on one line with the same path are the same dynamic instruction.

The copy is compiled from the function's own source, with the same file name and line numbers
(so traces, race reports and pictures name the learner's lines), and used only when the source,
compiled as it stands, gives exactly the function's bytecode; otherwise (no source, or source
that is not what runs) the launch runs the function itself and its accesses carry no path, and
gpulab.sim.count falls back to the n-th execution. Loops inside comprehensions and generator
expressions are not counted (they are expressions, not statements).
Taught in: lessons/02_cuda_with_numba.ipynb (through gpulab.sim.count)
"""

from __future__ import annotations
import __future__

import ast
import copy
import inspect
import textwrap
import types

_HOOKS = "__gpulab_loops__"  # the closure variable through which the copy reports its loops
_OUTER = "__gpulab_outer__"
# Each future feature is a bit of its own: the sum is their union.
_FUTURE_FLAGS = sum(getattr(__future__, name).compiler_flag
                    for name in __future__.all_feature_names)


class LoopTurns:
    """One launch's loop books: which loops surround each line of each instrumented code
    object, and the hooks the copies call. The running thread (`recorder.current`) keeps its
    own turns in its `turns` dict, so the books are shared by the whole launch."""

    def __init__(self, recorder):
        self.recorder = recorder
        self.lines: dict[object, dict[int, tuple[int, ...]]] = {}  # code -> line -> loop ids
        self._next_id = 0

    # -- called by the instrumented copies, on the running thread

    def start(self, loop: int) -> None:
        self.recorder.current.turns[loop] = 0

    def turn(self, loop: int) -> None:
        self.recorder.current.turns[loop] += 1

    # -- called when an access is logged

    def path_of(self, frame, turns: dict):
        """The path of an access made now in `frame`; None when the frame is not a copy."""
        lines = self.lines.get(frame.f_code)
        if lines is None:
            return None
        around = tuple(turns.get(loop, 0) for loop in lines.get(frame.f_lineno, ()))
        return (self.path_of(frame.f_back, turns), around)

    # -- making copies

    def instrumented(self, fn):
        """A copy of the plain Python function `fn` that reports its loops; `fn` itself when
        its source is not at hand or does not compile to its bytecode."""
        try:
            tree = _function_tree(fn)
            if _fingerprint(_compile(fn, tree, hooked=False)) != _fingerprint(fn.__code__):
                return fn  # the source we found is not the code that runs
            marker = _LoopMarker(self._new_id)
            marker.visit(tree)
            code = _compile(fn, ast.fix_missing_locations(tree), hooked=True)
        except (OSError, TypeError, SyntaxError, ValueError, IndexError):
            return fn
        self.lines[code] = marker.lines
        cells = {name: cell for name, cell in
                 zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True)}
        closure = tuple(types.CellType(self) if name == _HOOKS else cells[name]
                        for name in code.co_freevars)
        twin = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
        twin.__kwdefaults__ = fn.__kwdefaults__
        return twin

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id


def _fingerprint(code) -> tuple:
    """What a code object does, without where it sits: its bytecode, names and constants (the
    code objects among them by their own fingerprints)."""
    consts = tuple(_fingerprint(c) if isinstance(c, types.CodeType) else (type(c), repr(c))
                   for c in code.co_consts)
    return (code.co_code, code.co_names, code.co_varnames, code.co_freevars, consts)


def _function_tree(fn) -> ast.Module:
    """The parsed source of `fn` without its decorators, on the lines of its file, after the
    imports at the top level of its file: Python compiles `module.attr()` differently when
    `module` was imported there, and the copy must compile like the original."""
    lines, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef) or node.name != fn.__name__:
        raise ValueError(f"the source found for {fn.__name__} defines something else")
    node.decorator_list = []
    tree = ast.increment_lineno(tree, max(first, 1) - 1)
    whole, _ = inspect.findsource(fn)
    try:
        imports = [n for n in ast.parse("".join(whole)).body
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
    except SyntaxError:  # an IPython cell with magics, say: no imports to add
        imports = []
    tree.body = [n for n in imports if not (isinstance(n, ast.ImportFrom)
                                            and n.module == "__future__")] + tree.body
    return tree


def _compile(fn, tree: ast.Module, hooked: bool):
    """The code object of the function in `tree`, compiled as a closure over the same free
    variables as `fn` (and over the hooks, when `hooked`) so that names resolve alike."""
    tree = copy.deepcopy(tree)
    free = list(fn.__code__.co_freevars) + ([_HOOKS] if hooked else [])
    outer = ast.FunctionDef(
        name=_OUTER, args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                                        defaults=[]),
        body=[ast.Assign(targets=[ast.Name(name, ast.Store())], value=ast.Constant(None))
              for name in free] + tree.body[-1:] + [ast.Return(ast.Constant(None))],
        decorator_list=[])
    module = ast.fix_missing_locations(ast.Module(body=tree.body[:-1] + [outer],
                                                  type_ignores=[]))
    compiled = compile(module, fn.__code__.co_filename, "exec",
                       flags=fn.__code__.co_flags & _FUTURE_FLAGS, dont_inherit=True)
    (outer_code,) = [c for c in compiled.co_consts if isinstance(c, types.CodeType)]
    (code,) = [c for c in outer_code.co_consts
               if isinstance(c, types.CodeType) and c.co_name == fn.__name__]
    return code


class _LoopMarker(ast.NodeTransformer):
    """Puts `__gpulab_loops__.start(id)` before each loop statement of the function and
    `__gpulab_loops__.turn(id)` first in its body; notes which loops surround each line."""

    def __init__(self, new_id):
        self.new_id = new_id
        self.lines: dict[int, tuple[int, ...]] = {}
        self.depth = 0  # 1 inside the function being copied, more inside a nested def

    def visit_FunctionDef(self, node):
        self.depth += 1
        if self.depth == 1:
            self.generic_visit(node)
        self.depth -= 1
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        return node  # its own code object, not counted

    def _loop(self, node):
        loop = self.new_id()
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
            self.lines[line] = self.lines.get(line, ()) + (loop,)
        self.generic_visit(node)
        node.body.insert(0, _hook(node, "turn", loop))
        return [_hook(node, "start", loop), node]

    visit_For = visit_While = visit_AsyncFor = _loop



def _hook(where: ast.AST, method: str, loop: int) -> ast.stmt:
    call = ast.Expr(ast.Call(ast.Attribute(ast.Name(_HOOKS, ast.Load()), method, ast.Load()),
                             [ast.Constant(loop)], []))
    for node in ast.walk(call):
        ast.copy_location(node, where)
        node.end_lineno, node.end_col_offset = where.lineno, where.col_offset
    return call
