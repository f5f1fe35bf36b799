"""The `teola` command: demo, bench, graph, doctor."""

from __future__ import annotations

import argparse
import signal
import sys


def _demo(args: argparse.Namespace) -> int:
    from .bench import demo

    demo.main(questions=args.questions, n_docs=args.docs, max_tokens=args.max_tokens, out_dir=args.out,
              hosting=args.hosting)
    return 0


def _bench(args: argparse.Namespace) -> int:
    import json
    import shlex
    from pathlib import Path

    from .bench import report

    out, page = Path(args.out or "docs/benchmarks"), Path(args.page or "docs/benchmarks.md")
    if args.report_only and (args.resume or args.fresh):
        print("teola bench: --report-only reads results.json; it does not run (drop --resume / --fresh)",
              file=sys.stderr)
        return 2
    if args.rebound and not args.report_only:
        print("teola bench: --rebound recomputes a finished run's bounds; use it with --report-only", file=sys.stderr)
        return 2
    if args.report_only:
        results = json.loads((out / "results.json").read_text())
        if args.rebound:
            from .bench.rebound import rebound

            try:
                traces = json.loads((out / "traces.json").read_text())["apps"]
                done = rebound(results, traces, "teola " + shlex.join(args.argv))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"teola bench: --rebound reads the run's query traces, {out / 'traces.json'}: {exc!r} (a run "
                      "writes them with its bound runs, not under --no-bound)", file=sys.stderr)
                return 2
            print("bounds recomputed from traces.json: " + (", ".join(done) or "no app"))
    else:
        from .bench.apps import APPS
        from .bench.checkpoint import Checkpoint, CheckpointError
        from .bench.runner import Bench, BenchConfig, quick_config

        try:
            if args.resume:
                given = [flag for flag, value in (
                    ("--quick", args.quick), ("--apps", args.apps), ("--questions", args.questions),
                    ("--systems", args.systems), ("--no-ablations", args.no_ablations),
                    ("--no-poisson", args.no_poisson), ("--no-bound", args.no_bound),
                    ("--poisson-queries", args.poisson_queries), ("--poisson-apps", args.poisson_apps),
                    ("--poisson-rates", args.poisson_rates), ("--max-tokens", args.max_tokens),
                    ("--seed", args.seed), ("--out", args.out), ("--page", args.page), ("--fresh", args.fresh))
                    if value not in (None, False)]
                if given:
                    print(f"teola bench: --resume continues a run with the settings it started with; drop {given}",
                          file=sys.stderr)
                    return 2
                checkpoint = Checkpoint.resume(Path(args.checkpoint))
                config = BenchConfig(**checkpoint.config)
                out, page = Path(checkpoint.data.get("out", out)), Path(checkpoint.data.get("page", page))
            else:
                overrides: dict = {"command": "teola " + shlex.join(args.argv)}
                if args.apps or args.poisson_apps:
                    unknown = sorted((set(args.apps or ()) | set(args.poisson_apps or ())) - set(APPS))
                    if unknown:
                        print(f"teola bench: unknown apps {unknown}; choose from {sorted(APPS)}", file=sys.stderr)
                        return 2
                if args.apps:
                    overrides["apps"] = args.apps
                for key in ("questions", "poisson_queries", "poisson_apps", "poisson_rates", "max_tokens", "seed"):
                    if getattr(args, key) is not None:
                        overrides[key] = getattr(args, key)
                if args.systems:
                    overrides["systems"] = args.systems
                if args.no_ablations:
                    overrides["ablations"] = False
                if args.no_poisson:
                    overrides["poisson_apps"] = []
                if args.no_bound:
                    overrides["bound"] = False
                config = quick_config(**overrides) if args.quick else BenchConfig(**overrides)
                config.chosen_systems()  # unknown system names fail before any engine starts
                checkpoint = Checkpoint.start(Path(args.checkpoint), dict(vars(config)), fresh=args.fresh)
                # absolute: a resume from another checkout (of the same commit) writes here too
                checkpoint.data.update(out=str(out.resolve()), page=str(page.resolve()))
        except (CheckpointError, ValueError) as exc:
            print(f"teola bench: {exc}", file=sys.stderr)
            return 2
        # `kill` stops a run as Ctrl-C does, through Python's clean-up (Bench.run's finally:
        # progress saved, engines closed). Ray starts on the runtime's own thread, so its
        # driver installs no SIGTERM handler of its own: this is it.
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        results = Bench(config, checkpoint=checkpoint).run()
    written = report.generate(results, out, page)
    if not args.report_only:
        checkpoint.finish()  # only now: a run whose results were not written can still be resumed
    print("wrote " + ", ".join(str(p) for p in written.values()))
    return 0


def _graph(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .capture import app_graphs
    from .ir.picture import to_png
    from .optimizer import CostModel, optimize

    build = app_graphs.APPS[args.app]
    before = build()
    cost = CostModel.default()
    if args.hardware == "shared-cpu":  # every engine on one machine's cores, as without a GPU
        cost = cost.with_compute_groups({}, default_group="cpu:host")
    after = optimize(build(), disabled=args.disable or (), cost_model=cost)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.app}_before.mmd").write_text(before.to_mermaid())
    (out / f"{args.app}_after.mmd").write_text(after.to_mermaid())
    (out / f"{args.app}_before.dot").write_text(before.to_dot())
    (out / f"{args.app}_after.dot").write_text(after.to_dot())
    png = to_png({f"{args.app}: module order": before, f"{args.app}: optimized": after}, out / f"{args.app}.png")
    print(after.explain())
    print(f"\ncritical path: {before.critical_path(cost)[0]:.3f} s before, {after.critical_path(cost)[0]:.3f} s after"
          f" (default cost model, unlimited engines; planned for {args.hardware} hardware)\nwrote {out}/{args.app}_{{before,after}}.{{mmd,dot}} and {png}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    import shlex
    from pathlib import Path

    from .sim import report
    from .sim.hardware import DEFAULT_DEPLOYMENTS

    sim = report.run(Path(args.results), Path(args.profile), args.deploy or DEFAULT_DEPLOYMENTS,
                     "teola " + shlex.join(args.argv), Path(args.traces) if args.traces else None)
    report.write(sim, Path(args.out), Path(args.page))
    for app, systems in sim["calibration"].items():
        for system, row in systems.items():
            if system != "poisson":
                print(f"{app:>16} {system:>17}: predicted {row['predicted_mean_s']:.2f} s, measured "
                      f"{row['measured_mean_s']:.2f} s ({report._pct(row['error_mean'])})")
    for name, pred in sim["predictions"].items():
        speedups = ", ".join(f"{app} {row['speedup']:.2f}x" for app, row in pred["apps"].items())
        print(f"{name}: {speedups}")
    print(f"wrote {args.out} and {args.page}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import run_checks

    return 0 if run_checks(start_llm=not args.skip_llm) else 1


def _configure_logging(verbose: int) -> None:
    """The library only logs (to "teola_plugin"); the command decides where it goes:
    warnings by default, -v info (engines starting, opaque components), -vv debug."""
    import logging

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.getLogger("teola_plugin").setLevel(level)


def _verbose_flag(parser: argparse.ArgumentParser, default: object = 0) -> None:
    parser.add_argument("-v", "--verbose", action="count", default=default,
                        help="log what the library does (-v info, -vv debug)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="teola", description="Teola: primitive-level scheduling for LLM apps.")
    _verbose_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="document QA with plain LlamaIndex and with Teola, side by side")
    p.add_argument("--questions", type=int, default=3, help="HotpotQA questions to answer (default 3)")
    p.add_argument("--docs", type=int, default=60, help="documents uploaded with each question (default 60)")
    p.add_argument("--max-tokens", type=int, default=48, help="answer length limit (default 48)")
    p.add_argument("--out", default="out/demo", help="where pictures and traces go (default out/demo)")
    p.add_argument("--hosting", choices=["ray", "local"], default="ray", help="engines in Ray actors or in-process")
    p.set_defaults(fn=_demo)

    from .bench.checkpoint import DEFAULT_PATH as DEFAULT_CHECKPOINT  # stdlib only: cheap to import

    p = sub.add_parser("bench", help="end-to-end benchmark: the paper's apps, plain frameworks vs Teola")
    p.add_argument("--quick", action="store_true", help="1 question per app, no ablations, one short Poisson sweep (~10 min on 2 cores)")
    p.add_argument("--apps", nargs="+", help="apps to run (default: all ten)")
    p.add_argument("--questions", type=int, help="measured questions per app (default 50; quick 1)")
    p.add_argument("--systems", nargs="+", help="systems to run (default: all)")
    p.add_argument("--no-ablations", action="store_true", help="skip the teola-no-<pass> systems")
    p.add_argument("--no-poisson", action="store_true", help="skip the open-loop load runs")
    p.add_argument("--no-bound", action="store_true", help="skip the isolated runs that measure the bound")
    p.add_argument("--poisson-queries", type=int, help="arrivals per rate and system")
    p.add_argument("--poisson-apps", nargs="+", help="apps with open-loop load runs (default: search_gen, "
                   "doc_qa_naive, doc_qa_advanced)")
    p.add_argument("--poisson-rates", type=float, nargs="+",
                   help="arrival rates, as multiples of plain-concurrent's capacity (default 0.5 1 2 4)")
    p.add_argument("--max-tokens", type=int, help="answer length limit (default 32)")
    p.add_argument("--seed", type=int, help="question sampling and arrival seed (default 0)")
    p.add_argument("--out", help="results.json and PNGs (default docs/benchmarks)")
    p.add_argument("--page", help="the generated page (default docs/benchmarks.md)")
    p.add_argument("--report-only", action="store_true", help="regenerate the page and plots from results.json")
    p.add_argument("--rebound", action="store_true",
                   help="with --report-only: recompute the bounds from the run's recorded traces (traces.json) "
                        "with this code's bound; the measurements stay as they were")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT),
                   help=f"progress saved after every question, bound and sweep (default {DEFAULT_CHECKPOINT})")
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --checkpoint, with the settings it started with")
    p.add_argument("--fresh", action="store_true", help="start over, discarding an unfinished run's checkpoint")
    p.set_defaults(fn=_bench)

    from .capture.app_graphs import APPS

    p = sub.add_parser("graph", help="the primitive graph of an app before and after optimization",
                       description="Writes the primitive graph of one of the paper's apps before and after "
                                   "optimization (Mermaid, DOT and a PNG picture) and prints what each pass changed.")
    p.add_argument("app", choices=sorted(APPS), help="which app")
    p.add_argument("--disable", action="append", metavar="PASS", help="a pass to switch off (repeatable)")
    p.add_argument("--hardware", choices=("own", "shared-cpu"), default="own",
                   help="plan for engines each on hardware of their own (default; e.g. LLM and embedder each "
                        "on a GPU) or all sharing one CPU (a machine without GPU: passes that only overlap "
                        "engines decline)")
    p.add_argument("--out", default="out/graphs", help="where the pictures go (default out/graphs)")
    p.set_defaults(fn=_graph)

    from .sim.hardware import DEFAULT_DEPLOYMENTS

    p = sub.add_parser("simulate", help="simulate the scheduler on a benchmark run's traces: calibration, GPU predictions",
                       description="Replays the query traces a `teola bench` run recorded (traces.json beside its "
                                   "results.json) through a discrete-event model of the graph and engine "
                                   "schedulers: predicted against measured latencies of every system the run "
                                   "measured, and predicted speedups on GPU deployments.")
    p.add_argument("--results", default="docs/benchmarks/calibration/results.json",
                   help="a teola bench results.json (default docs/benchmarks/calibration/results.json)")
    p.add_argument("--traces", help="its query traces (default: traces.json beside --results)")
    p.add_argument("--profile", default="docs/benchmarks/engine_profiles.json",
                   help="engine profiles of the machine the run was on (default docs/benchmarks/engine_profiles.json)")
    p.add_argument("--deploy", action="append", metavar="GPU:MODEL[:host]",
                   help="a deployment to predict (repeatable; :host keeps the embedder and reranker on the host "
                        "CPU); default: " + ", ".join(DEFAULT_DEPLOYMENTS))
    p.add_argument("--out", default="docs/benchmarks/simulation.json", help="(default docs/benchmarks/simulation.json)")
    p.add_argument("--page", default="docs/benchmarks/simulation.md", help="(default docs/benchmarks/simulation.md)")
    p.set_defaults(fn=_simulate)

    p = sub.add_parser("doctor", help="check vLLM, the model, Ray and chromadb; say how to fix what is wrong",
                       description="Checks each part the engines need and prints the fix for what fails "
                                   "(docs/troubleshooting.md has more). Exit status 1 if anything failed.")
    p.add_argument("--skip-llm", action="store_true", help="do not start vLLM (faster)")
    p.set_defaults(fn=_doctor)

    for command in sub.choices.values():  # `teola graph -v ...` works as well as `teola -v graph ...`
        _verbose_flag(command, default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    _configure_logging(args.verbose)
    from .errors import TeolaError

    try:
        return int(args.fn(args))
    except TeolaError as exc:  # a setting or input the user can fix: say what, no traceback
        parser.exit(2, f"teola {args.command}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
