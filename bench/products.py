"""The train step's matrix products, each timed alone: `python -m bench.products [--compare]`.

The question it answers: how fast could the train step of `bench.train` be if everything but
its matrix products were free, and each product ran as fast as it does alone (operands hot
in cache, no other work beside it)? It compiles the same step (same preset, batch and dtype),
reads every dot instruction of the optimized program XLA will run (`compiled.as_text()`,
fused or not), groups identical ones (operand shapes, dtypes, contracting and batch
dimensions), and times each kind on its own: a jitted `lax.dot_general` of the same form
on random operands, the median of --reps calls. The count times that median, summed over
the kinds, is `products_s`: the step's products at the speed XLA runs each of them alone on
this machine. Then the step itself is timed (`bench.train`'s measurement), and with
--compare the peer's step too (transformers' MarianMTModel, same configuration).

Output, JSON lines: one line per kind of product (count, shapes, GFLOP/s of the median and
of the fastest call, total ms at the median), then a summary with
  products_flop     FLOP of all the step's products: bench.common.train_flops, the peers'
                    formula, when the step multiplies nothing the formula leaves out (the
                    tests check that it does not); products_gflop the same in GFLOP
  products_s        the products' time, each kind timed alone
  dispatch_s        the median time of a jitted call that does almost nothing: the call
                    overhead inside each product's timing (it matters for small products)
  products_net_s    products_s less one dispatch_s per product
  step_s            the median step time (bench.train); step_s_min the fastest step
  products_share    products_net_s / step_s: near 1 means the step is its products
  peer_step_s       with --compare: the peer's median step time; peer_step_s_min its fastest
  ceiling_ratio     peer_step_s / products_net_s: the highest ours-over-peer ratio this step
                    could reach with XLA's products and nothing else costing time
  *_best            the same from the fastest calls and steps (products_best_net_s: each
                    kind's fastest call times its count, less the fastest dispatch): other
                    work on a shared machine only slows calls down, so these are the figures
                    least disturbed by it

Products inside loops (gradient accumulation's scan) would run more than once per step, so
only --accum-steps 1 is measured.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from bench import common, train as bench_train
from nmt.runtime import allocator
from transformer.config import PRESETS

HLO_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64",
              "s32": "int32", "s8": "int8"}

# `%name = f32[1024,512]{1,0} ...`: an instruction's name, element type and dimensions.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (\w+)\[([\d,]*)\]")
# `... dot(%lhs, %rhs), lhs_batch_dims={0}, lhs_contracting_dims={2}, ...`
_DOT = re.compile(r"\bdot\(%([\w.\-]+), %([\w.\-]+)\)")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%[\w.\-]+ ")


@dataclasses.dataclass(frozen=True)
class Product:
    """One kind of matrix product: `lax.dot_general` of these operands and dimensions."""

    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    lhs_contracting: tuple[int, ...]
    rhs_contracting: tuple[int, ...]
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str

    @property
    def dimension_numbers(self):
        return ((self.lhs_contracting, self.rhs_contracting), (self.lhs_batch, self.rhs_batch))

    @property
    def flops(self) -> int:
        """2 x multiply-adds = 2 x lhs size x rhs size / (contracted size x batch size)."""
        contracted = _size(self.lhs_shape, self.lhs_contracting)
        batch = _size(self.lhs_shape, self.lhs_batch)
        return 2 * _size(self.lhs_shape) * _size(self.rhs_shape) // (contracted * batch)

    def describe(self) -> str:
        return (f"{self.lhs_dtype}{list(self.lhs_shape)} . {self.rhs_dtype}"
                f"{list(self.rhs_shape)} contracting {list(self.lhs_contracting)}/"
                f"{list(self.rhs_contracting)}, batch {list(self.lhs_batch)}/"
                f"{list(self.rhs_batch)} -> {self.out_dtype}")


def _size(shape: tuple[int, ...], axes: tuple[int, ...] | None = None) -> int:
    return int(np.prod([shape[a] for a in (range(len(shape)) if axes is None else axes)],
                       dtype=np.int64))


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _dtype(hlo_type: str, line: str) -> str:
    if hlo_type not in HLO_DTYPES:
        raise ValueError(f"element type {hlo_type} is not one of {sorted(HLO_DTYPES)}: {line}")
    return HLO_DTYPES[hlo_type]


def _attribute(line: str, name: str) -> tuple[int, ...]:
    found = re.search(rf"\b{name}=\{{([\d,]*)\}}", line)
    return _dims(found.group(1)) if found else ()


def products_in_hlo(hlo_text: str) -> collections.Counter[Product]:
    """Every dot instruction of an HLO module's text, counted by kind.

    Operands are named, not shaped, in a dot's line, so their shapes are looked up among the
    instructions (fusion parameters included) of the same computation. Raises ValueError on
    a dot whose operands it cannot read or find: a change in XLA's text format must not pass
    as a step with fewer products.
    """
    found: collections.Counter[Product] = collections.Counter()
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    for line in hlo_text.splitlines():
        if _COMPUTATION.match(line):
            shapes = {}  # names are looked up within one computation
        instruction = _INSTRUCTION.match(line)
        if not instruction:
            continue
        name, element_type, dims = instruction.groups()
        shapes[name] = (element_type, _dims(dims))
        if " dot(" not in line:
            continue
        dot = _DOT.search(line)
        if not dot:
            raise ValueError(f"dot {name}: cannot read its operands (HLO text format?): {line}")
        lhs, rhs = dot.groups()
        if lhs not in shapes or rhs not in shapes:
            raise ValueError(f"dot {name}: operand shapes not found in its computation: {line}")
        (lhs_type, lhs_shape), (rhs_type, rhs_shape) = shapes[lhs], shapes[rhs]
        found[Product(lhs_shape, rhs_shape,
                      _attribute(line, "lhs_contracting_dims"),
                      _attribute(line, "rhs_contracting_dims"),
                      _attribute(line, "lhs_batch_dims"), _attribute(line, "rhs_batch_dims"),
                      _dtype(lhs_type, line), _dtype(rhs_type, line),
                      _dtype(element_type, line))] += 1
    return found


def time_alone(product: Product, reps: int) -> list[float]:
    """Seconds of `reps` calls of one jitted dot_general of this form, on random operands."""
    rng = np.random.default_rng(0)  # numpy: no compilation per shape
    lhs = jnp.asarray(rng.standard_normal(product.lhs_shape, np.float32), product.lhs_dtype)
    rhs = jnp.asarray(rng.standard_normal(product.rhs_shape, np.float32), product.rhs_dtype)
    multiply = jax.jit(lambda a, b: jax.lax.dot_general(
        a, b, product.dimension_numbers, preferred_element_type=jnp.dtype(product.out_dtype)))
    return common.call_times(multiply, lhs, rhs, reps=reps)


def dispatch_times(reps: int) -> list[float]:
    """Seconds of calls of a jitted function that does almost nothing: the part of each
    product's timed call that is JAX's and XLA's call overhead rather than the product."""
    return common.call_times(jax.jit(lambda a: a + 1.0), jnp.zeros((8,), jnp.float32),
                             reps=max(reps, 20))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=common.bench_prog(), description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="base", choices=sorted(PRESETS))
    ap.add_argument("--vocab", type=common.positive_int, default=8000)
    ap.add_argument("--batch", type=common.positive_int, default=32)
    ap.add_argument("--src-len", type=common.positive_int, default=32)
    ap.add_argument("--tgt-len", type=common.positive_int, default=32)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--reps", type=common.positive_int, default=20,
                    help="timed calls of each product")
    ap.add_argument("--steps", type=common.positive_int, default=10, help="timed train steps")
    ap.add_argument("--warmup", type=common.non_negative_int, default=2,
                    help="untimed steps after compiling")
    ap.add_argument("--compare", action="store_true", help="also time the peer's step")
    ap.add_argument("--threads", type=common.positive_int, default=2, help="peer torch threads")
    return ap.parse_args(argv)


def step_args(args: argparse.Namespace) -> argparse.Namespace:
    """bench.train's arguments for the same step."""
    return bench_train.parse_args([
        "--preset", args.preset, "--vocab", str(args.vocab), "--batch", str(args.batch),
        "--src-len", str(args.src_len), "--tgt-len", str(args.tgt_len),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--dtype", args.dtype,
        "--threads", str(args.threads), *(["--compare"] if args.compare else [])])


def main(argv=None) -> None:
    args = parse_args(argv)
    train_args = step_args(args)
    ours = bench_train.OurStep(train_args)
    products = products_in_hlo(ours.step.as_text())
    if not products:
        raise SystemExit("bench.products: no dot instruction found in the compiled step")
    count = sum(products.values())
    dispatch = dispatch_times(args.reps)
    products_s = products_best_s = 0.0  # each kind's median / fastest call, times its count
    for product, n in sorted(products.items(), key=lambda item: -item[0].flops * item[1]):
        times = time_alone(product, args.reps)
        median, best = statistics.median(times), min(times)
        products_s += n * median
        products_best_s += n * best
        common.emit({"system": "product", "preset": args.preset, "count": n,
                     "product": product.describe(), "gflop_each": round(product.flops / 1e9, 4),
                     "gflops_per_s": round(product.flops / median / 1e9, 1),
                     "gflops_per_s_best": round(product.flops / best / 1e9, 1),
                     "total_ms": round(n * median * 1e3, 3)})
    products_net_s = products_s - count * statistics.median(dispatch)
    products_best_net_s = products_best_s - count * min(dispatch)
    step = ours.measure()
    flops = sum(product.flops * n for product, n in products.items())
    summary = {"system": "summary", "preset": args.preset, "batch": args.batch,
               "src_len": args.src_len, "tgt_len": args.tgt_len, "dtype": args.dtype,
               "products": count, "kinds": len(products),
               "products_flop": flops, "products_gflop": round(flops / 1e9, 2),
               "model_gflop_per_step": round(common.train_flops(
                   ours.config, args.batch, args.src_len, args.tgt_len) / 1e9, 2),
               "products_s": round(products_s, 6),
               "dispatch_s": round(statistics.median(dispatch), 6),
               "products_net_s": round(products_net_s, 6),
               "products_best_net_s": round(products_best_net_s, 6),
               "step_s": round(step["step_s"], 4), "step_s_min": round(step["step_s_min"], 4),
               "products_share": round(products_net_s / step["step_s"], 3),
               "products_share_best": round(products_best_net_s / step["step_s_min"], 3),
               **common.environment()}
    if args.compare:
        peer = common.run_peer("hf_train_step.py",
                               bench_train.peer_args(train_args, ours.config),
                               dtype=args.dtype)
        common.emit(peer)
        summary.update(peer_step_s=peer["step_s"], peer_step_s_min=peer["step_s_min"],
                       ours_over_peer=round(peer["step_s"] / step["step_s"], 3),
                       ceiling_ratio=round(peer["step_s"] / products_net_s, 3),
                       ceiling_ratio_best=round(peer["step_s_min"] / products_best_net_s, 3))
    common.emit(summary)


if __name__ == "__main__":
    allocator.preload()  # as train.py and translate.py: mimalloc under XLA:CPU
    main()
