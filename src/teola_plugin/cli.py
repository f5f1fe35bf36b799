"""The `teola` command: demo, graph, doctor, bench-engines."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from .bench import demo

    demo.main(questions=args.questions, n_docs=args.docs, max_tokens=args.max_tokens, out_dir=args.out,
              hosting=args.hosting)
    return 0


def _graph(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .ir import app_graphs
    from .optimizer import CostModel, optimize

    build = app_graphs.APPS[args.app]
    before = build()
    after = optimize(build(), disabled=args.disable or ())
    cost = CostModel.default()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.app}_before.mmd").write_text(before.to_mermaid())
    (out / f"{args.app}_after.mmd").write_text(after.to_mermaid())
    (out / f"{args.app}_before.dot").write_text(before.to_dot())
    (out / f"{args.app}_after.dot").write_text(after.to_dot())
    print(after.explain())
    print(f"\ncritical path: {before.critical_path(cost)[0]:.3f} s before, {after.critical_path(cost)[0]:.3f} s after"
          f" (default cost model)\nwrote {out}/{args.app}_{{before,after}}.{{mmd,dot}}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    return 0 if run_checks(start_llm=not args.skip_llm) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teola", description="Teola: primitive-level scheduling for LLM apps.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="document QA on the real engines: module order vs Teola, side by side")
    p.add_argument("--questions", type=int, default=4, help="HotpotQA questions to answer (default 4)")
    p.add_argument("--docs", type=int, default=60, help="documents uploaded with each question (default 60)")
    p.add_argument("--max-tokens", type=int, default=48, help="answer length limit (default 48)")
    p.add_argument("--out", default="out/demo", help="where pictures and traces go (default out/demo)")
    p.add_argument("--hosting", choices=["ray", "local"], default="ray", help="engines in Ray actors or in-process")
    p.set_defaults(fn=_demo)

    from .ir.app_graphs import APPS

    p = sub.add_parser("graph", help="the primitive graph of an app before and after optimization")
    p.add_argument("app", choices=sorted(APPS))
    p.add_argument("--disable", action="append", help="a pass to switch off (repeatable)")
    p.add_argument("--out", default="out/graphs")
    p.set_defaults(fn=_graph)

    p = sub.add_parser("doctor", help="check vLLM, the model, Ray and chromadb; say how to fix what is wrong")
    p.add_argument("--skip-llm", action="store_true", help="do not start vLLM (faster)")
    p.set_defaults(fn=_doctor)

    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":
    sys.exit(main())
