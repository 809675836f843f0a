"""LSTM and GRU, expanded on import into their cell equations over the static sequence length.

An unrolled recurrence is made of operators the rest of ember already has rows for: the input
projection of every time step is one MatMul (the whole sequence's rows at once), each step adds
its recurrent MatMul, splits the gates, applies the gate activations (one table each in int8)
and combines them with elementwise products of activations; the outputs are Concats of the
steps. So everything after the importer (folding, quantization, lowering, the machine) sees
ordinary nodes, and the integer arithmetic needs nothing new.

ONNX semantics (operator docs): LSTM gates in the order i, o, f, c with
  C_t = f ⊙ C_{t-1} + i ⊙ g(c),  H_t = o ⊙ h(C_t),  P the peepholes (i, o, f);
GRU gates in the order z, r, h with
  H_t = (1 - z) ⊙ h + z ⊙ H_{t-1} = h + z ⊙ (H_{t-1} - h),
the recurrent term of h being (r ⊙ H_{t-1}) Rhᵀ + Rbh, or r ⊙ (H_{t-1} Rhᵀ + Rbh) with
linear_before_reset=1. `clip` bounds every gate's input before its activation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from compiler.errors import CompileError
from compiler.graph.ir import Node, Value

# Makes a constant value of the graph from an array; returns its name.
MakeConst = Callable[[str, np.ndarray], str]


class _Writer:
    """Appends nodes of the table's rows with fresh value names under the node's name."""

    def __init__(self, node: Node, make_const: MakeConst):
        self.node, self.make_const = node, make_const
        self.nodes: list[Node] = []
        self.count = 0

    def const(self, label: str, array) -> str:
        return self.make_const(f"{self.node.name}/{label}", np.asarray(array))

    def parts(self, name: str, sizes: Sequence[int], label: str) -> list[str]:
        """`name` cut along axis 1 into consecutive parts of `sizes` (Slices: valid at every
        opset ember imports, unlike Split's forms)."""
        from compiler.graph import ops as table
        cuts = np.cumsum([0, *sizes])
        return [self.one(table.SLICE, [name, self.const(f"{label}{k}/start", [cuts[k]]),
                                       self.const(f"{label}{k}/end", [cuts[k + 1]]),
                                       self.const(f"{label}{k}/axis", [1])], f"{label}{k}")
                for k in range(len(sizes))]

    def one(self, row, inputs: Sequence[str], label: str, name: str | None = None,
            **attrs) -> str:
        """A node of `row` whose one output is `name`, or a fresh name under the node's."""
        self.count += 1
        out = name or f"{self.node.name}/{label}"
        self.nodes.append(Node(row.name, f"{self.node.name}/{label}#{self.count}",
                               tuple(inputs), (out,), attrs))
        return out


def _refuse(node: Node, what: str) -> CompileError:
    return CompileError(f"node {node.name!r} ({node.op}): {what}")


def _activations(node: Node, count: int, directions: int, defaults: Sequence[str]) -> list:
    """The rows of the gate activations per direction: only attribute-free elementwise ops
    that ember maps by a table (Sigmoid, Tanh, Relu, ...)."""
    from compiler.graph import ops as table
    names = node.attrs.get("activations") or list(defaults) * directions
    if len(names) != count * directions:
        raise _refuse(node, f"activations {names} should name {count} functions per direction "
                            f"({count * directions} in all)")
    if node.attrs.get("activation_alpha") or node.attrs.get("activation_beta"):
        raise _refuse(node, "activation_alpha/activation_beta are not supported; the gate "
                            "activations must take no parameters (Sigmoid, Tanh, Relu)")
    rows = []
    for name in names:
        row = table.OPS.get(name)
        if row is None or row.attrs or row.inputs != row.inputs[:1] or row.lower is not \
                table.Lower.LUT or row.quant is None:
            raise _refuse(node, f"activations: {name!r} is not supported; the gates take "
                                "Sigmoid, Tanh, Relu and other parameter-free elementwise "
                                "operators")
        rows.append(row)
    return [rows[d * count:(d + 1) * count] for d in range(directions)]


def _common(node: Node, inputs: Sequence[Value | None], gates: int):
    """Shapes and constants shared by LSTM and GRU: (T, B, I, H, directions, W, R, bias)."""
    x, w, r = inputs[0], inputs[1], inputs[2]
    if node.attrs.get("layout", 0) not in (0, 1):
        raise _refuse(node, f"layout={node.attrs['layout']}; ONNX defines 0 and 1")
    direction = node.attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise _refuse(node, f"direction={direction!r} is not supported; ember takes forward, "
                            "reverse and bidirectional")
    if w.const is None or r.const is None:
        raise _refuse(node, "its weights W and R must be constants")
    shape = x.type.shape
    if len(shape) != 3 or 0 in shape:
        raise _refuse(node, f"its input X has shape {list(shape)}; a static [T, B, I] (layout 0) "
                            "or [B, T, I] (layout 1) is needed: give --input-shape")
    t, b = (shape[1], shape[0]) if node.attrs.get("layout", 0) else shape[:2]
    dirs = 2 if direction == "bidirectional" else 1
    hidden = int(r.const.shape[-1])
    if node.attrs.get("hidden_size") not in (None, hidden):
        raise _refuse(node, f"hidden_size={node.attrs['hidden_size']} but R has shape "
                            f"{list(r.const.shape)}")
    if w.const.shape != (dirs, gates * hidden, shape[2]):
        raise _refuse(node, f"W has shape {list(w.const.shape)}; expected "
                            f"{[dirs, gates * hidden, shape[2]]}")
    bias = inputs[3] if len(inputs) > 3 else None
    if bias is not None and bias.const is None:
        raise _refuse(node, "its bias B must be a constant")
    bias = np.zeros((dirs, 2 * gates * hidden), np.float32) if bias is None else bias.const
    lens = inputs[4] if len(inputs) > 4 else None
    if lens is not None and (lens.const is None or np.any(np.asarray(lens.const) != t)):
        raise _refuse(node, f"sequence_lens must be absent or a constant equal to the sequence "
                            f"length {t} for every batch entry (shorter sequences are not "
                            "supported)")
    return t, b, shape[2], hidden, dirs, direction, w.const, r.const, bias


def _initial(wr: _Writer, node: Node, value: Value | None, d: int, b: int, hidden: int,
             label: str) -> str | None:
    """Direction d's initial state as a [B, H] value, or None when it is absent or zero."""
    from compiler.graph import ops as table
    if value is None or (value.const is not None and not np.any(value.const)):
        return None
    axis = 1 if node.attrs.get("layout", 0) else 0
    part = wr.one(table.SLICE, [value.name, wr.const(f"{label}{d}/start", [d]),
                                wr.const(f"{label}{d}/end", [d + 1]),
                                wr.const(f"{label}{d}/axis", [axis])], f"{label}{d}")
    return wr.one(table.RESHAPE, [part, wr.const(f"{label}{d}/shape", [b, hidden])],
                  f"{label}{d}/rows")


def _sequence_rows(wr: _Writer, node: Node, x: Value, t: int, b: int, i: int) -> str:
    """X as [T * B, I] rows in time order."""
    from compiler.graph import ops as table
    name = x.name
    if node.attrs.get("layout", 0):
        name = wr.one(table.TRANSPOSE, [name], "x_time_major", perm=[1, 0, 2])
    return wr.one(table.RESHAPE, [name, wr.const("x_rows/shape", [t * b, i])], "x_rows")


def _time_order(direction: str, d: int, steps: int):
    """The steps direction d runs: forward, or backward for reverse and a bidirectional's
    second."""
    forward = direction == "forward" or (direction == "bidirectional" and d == 0)
    return range(steps) if forward else reversed(range(steps))


def _step_rows(wr: _Writer, xw: str, k: int, b: int, label: str) -> str:
    """Step k's B rows of the input projection (all steps' rows in time order)."""
    from compiler.graph import ops as table
    return wr.one(table.SLICE, [xw, wr.const(f"{label}/start", [k * b]),
                                wr.const(f"{label}/end", [(k + 1) * b]),
                                wr.const(f"{label}/axis", [0])], f"{label}/xw")


def _clip(wr: _Writer, node: Node, name: str, label: str) -> str:
    from compiler.graph import ops as table
    bound = node.attrs.get("clip")
    if bound is None:
        return name
    return wr.one(table.CLIP, [name, wr.const(f"{label}/lo", np.float32(-bound)),
                               wr.const(f"{label}/hi", np.float32(bound))], label)


def _outputs(wr: _Writer, node: Node, steps: list[list[str]], last: list[list[str]],
             b: int, hidden: int) -> None:
    """Y from every step's H (per direction, in time order); Y_h and Y_c from the last."""
    from compiler.graph import ops as table
    layout = node.attrs.get("layout", 0)
    outs = list(node.outputs) + [""] * (3 - len(node.outputs))
    if outs[0]:
        per_dir = []
        for d, hs in enumerate(steps):
            lifted = [wr.one(table.RESHAPE, [h, wr.const(f"y/d{d}/t{k}/shape", [1, 1, b, hidden])],
                             f"y/d{d}/t{k}") for k, h in enumerate(hs)]
            per_dir.append(lifted[0] if len(lifted) == 1 else
                           wr.one(table.CONCAT, lifted, f"y/d{d}", axis=0))
        y = per_dir[0] if len(per_dir) == 1 else wr.one(table.CONCAT, per_dir, "y", axis=1)
        if layout:
            y = wr.one(table.TRANSPOSE, [y], "y_batch_major", perm=[2, 0, 1, 3])
        wr.one(table.IDENTITY, [y], "y_out", name=outs[0])
    for k, out in enumerate(outs[1:3]):
        if not out or k >= len(last[0]):
            continue
        lifted = [wr.one(table.RESHAPE, [state[k], wr.const(f"last{k}/d{d}/shape",
                                                            [1, b, hidden])], f"last{k}/d{d}")
                  for d, state in enumerate(last)]
        y = lifted[0] if len(lifted) == 1 else wr.one(table.CONCAT, lifted, f"last{k}", axis=0)
        if layout:
            y = wr.one(table.TRANSPOSE, [y], f"last{k}_batch_major", perm=[1, 0, 2])
        wr.one(table.IDENTITY, [y], f"last{k}_out", name=out)


def expand_lstm(node: Node, inputs: Sequence[Value | None], make_const: MakeConst) -> list[Node]:
    from compiler.graph import ops as table
    if node.attrs.get("input_forget", 0):
        raise _refuse(node, "input_forget=1 (coupled input and forget gates) is not supported")
    t, b, i, hidden, dirs, direction, w, r, bias = _common(node, inputs, 4)
    acts = _activations(node, 3, dirs, (table.SIGMOID.name, table.TANH.name, table.TANH.name))
    get = (lambda k: inputs[k] if len(inputs) > k else None)
    peep = get(7)
    if peep is not None and peep.const is None:
        raise _refuse(node, "its peepholes P must be a constant")
    wr = _Writer(node, make_const)
    rows = _sequence_rows(wr, node, inputs[0], t, b, i)
    steps, last = [], []
    for d in range(dirs):
        f_act, g_act, h_act = acts[d]
        xw = wr.one(table.MATMUL, [rows, wr.const(f"d{d}/W_T", w[d].T)], f"d{d}/xw")
        xw = wr.one(table.ADD, [xw, wr.const(f"d{d}/bias", bias[d, :4 * hidden]
                                             + bias[d, 4 * hidden:])], f"d{d}/xw_b")
        h = _initial(wr, node, get(5), d, b, hidden, "h0_")
        c = _initial(wr, node, get(6), d, b, hidden, "c0_")
        r_t = wr.const(f"d{d}/R_T", r[d].T)
        p = None if peep is None or not np.any(peep.const[d]) else peep.const[d]
        hs: dict[int, str] = {}
        for k in _time_order(direction, d, t):
            s = f"d{d}/t{k}"
            pre = _step_rows(wr, xw, k, b, s)
            if h is not None:
                pre = wr.one(table.ADD, [pre, wr.one(table.MATMUL, [h, r_t], f"{s}/hr")],
                             f"{s}/pre")
            gi, go, gf, gc = wr.parts(pre, [hidden] * 4, f"{s}/gate")

            def peephole(gate: str, state: str | None, which: int, label: str) -> str:
                if p is None or state is None:
                    return gate
                weight = wr.const(f"{s}/p{label}", p[which * hidden:(which + 1) * hidden])
                return wr.one(table.ADD, [gate, wr.one(table.MUL, [state, weight],
                                                       f"{s}/p{label}c")], f"{s}/{label}_p")

            gate_i = wr.one(f_act, [_clip(wr, node, peephole(gi, c, 0, "i"), f"{s}/i_clip")],
                            f"{s}/i")
            gate_f = wr.one(f_act, [_clip(wr, node, peephole(gf, c, 2, "f"), f"{s}/f_clip")],
                            f"{s}/f")
            cell = wr.one(g_act, [_clip(wr, node, gc, f"{s}/c_clip")], f"{s}/g")
            c_new = wr.one(table.MUL, [gate_i, cell], f"{s}/ig")
            if c is not None:
                c_new = wr.one(table.ADD, [wr.one(table.MUL, [gate_f, c], f"{s}/fc"), c_new],
                               f"{s}/c")
            c = c_new
            gate_o = wr.one(f_act, [_clip(wr, node, peephole(go, c, 1, "o"), f"{s}/o_clip")],
                            f"{s}/o")
            h = wr.one(table.MUL, [gate_o, wr.one(h_act, [c], f"{s}/hc")], f"{s}/h")
            hs[k] = h
        steps.append([hs[k] for k in range(t)])
        last.append([h, c])
    _outputs(wr, node, steps, last, b, hidden)
    return wr.nodes


def expand_gru(node: Node, inputs: Sequence[Value | None], make_const: MakeConst) -> list[Node]:
    from compiler.graph import ops as table
    t, b, i, hidden, dirs, direction, w, r, bias = _common(node, inputs, 3)
    acts = _activations(node, 2, dirs, (table.SIGMOID.name, table.TANH.name))
    get = (lambda k: inputs[k] if len(inputs) > k else None)
    before_reset = bool(node.attrs.get("linear_before_reset", 0))
    wr = _Writer(node, make_const)
    rows = _sequence_rows(wr, node, inputs[0], t, b, i)
    steps, last = [], []
    h3 = 3 * hidden
    for d in range(dirs):
        f_act, g_act = acts[d]
        wb, rb = bias[d, :h3], bias[d, h3:]
        # Rbh stays inside the reset product with linear_before_reset; else it is a constant
        # of the step like the rest and joins the input projection's bias.
        x_bias = wb + (np.concatenate([rb[:2 * hidden], np.zeros(hidden, rb.dtype)])
                       if before_reset else rb)
        xw = wr.one(table.MATMUL, [rows, wr.const(f"d{d}/W_T", w[d].T)], f"d{d}/xw")
        xw = wr.one(table.ADD, [xw, wr.const(f"d{d}/bias", x_bias)], f"d{d}/xw_b")
        h = _initial(wr, node, get(5), d, b, hidden, "h0_")
        r_zr = wr.const(f"d{d}/Rzr_T", r[d, :2 * hidden].T)
        r_h = wr.const(f"d{d}/Rh_T", r[d, 2 * hidden:].T)
        hs: dict[int, str] = {}
        for k in _time_order(direction, d, t):
            s = f"d{d}/t{k}"
            pre = _step_rows(wr, xw, k, b, s)
            x_zr, x_h = wr.parts(pre, [2 * hidden, hidden], f"{s}/x_part")
            if h is not None:
                x_zr = wr.one(table.ADD, [x_zr, wr.one(table.MATMUL, [h, r_zr], f"{s}/hr_zr")],
                              f"{s}/pre_zr")
            gz, gr = wr.parts(x_zr, [hidden] * 2, f"{s}/gate")
            z = wr.one(f_act, [_clip(wr, node, gz, f"{s}/z_clip")], f"{s}/z")
            reset = wr.one(f_act, [_clip(wr, node, gr, f"{s}/r_clip")], f"{s}/r")
            if h is None:
                if before_reset and np.any(rb[2 * hidden:]):
                    term = wr.one(table.MUL, [reset, wr.const(f"{s}/rbh", rb[2 * hidden:])],
                                  f"{s}/r_rbh")
                    x_h = wr.one(table.ADD, [x_h, term], f"{s}/pre_h")
            elif before_reset:
                hr = wr.one(table.MATMUL, [h, r_h], f"{s}/hr_h")
                if np.any(rb[2 * hidden:]):
                    hr = wr.one(table.ADD, [hr, wr.const(f"{s}/rbh", rb[2 * hidden:])],
                                f"{s}/hr_h_b")
                x_h = wr.one(table.ADD, [x_h, wr.one(table.MUL, [reset, hr], f"{s}/r_hr")],
                             f"{s}/pre_h")
            else:
                rh = wr.one(table.MUL, [reset, h], f"{s}/rh")
                x_h = wr.one(table.ADD, [x_h, wr.one(table.MATMUL, [rh, r_h], f"{s}/rh_r")],
                             f"{s}/pre_h")
            cand = wr.one(g_act, [_clip(wr, node, x_h, f"{s}/h_clip")], f"{s}/cand")
            # H_t = cand + z * (H_{t-1} - cand); with no H_{t-1}, cand - z * cand.
            if h is None:
                h = wr.one(table.SUB, [cand, wr.one(table.MUL, [z, cand], f"{s}/zc")], f"{s}/h")
            else:
                diff = wr.one(table.SUB, [h, cand], f"{s}/diff")
                h = wr.one(table.ADD, [cand, wr.one(table.MUL, [z, diff], f"{s}/zd")], f"{s}/h")
            hs[k] = h
        steps.append([hs[k] for k in range(t)])
        last.append([h])
    _outputs(wr, node, steps, last, b, hidden)
    return wr.nodes
