"""`fastrl` command line: train, eval, warmstart, data, store, app, demo, report, bench.

Heavy modules are imported inside each command so `fastrl --help` stays instant. A user error (a bad config key,
value or name, a missing file, a bad dataset row, a run another process is writing, a run with no whole checkpoint,
a full disk, a port another process serves on) prints one line naming what is wrong and exits with code 2; Ctrl-C or
SIGTERM during training prints one line (the run is marked stopped, and the command that continues it) and exits
with 130 / 143. Output cut short by its reader (`fastrl train --list-keys | head`) ends quietly with 141, as a
shell tool killed by SIGPIPE does. `--debug` (anywhere on the line) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path

from fastrl_core.shipped import config_names


def _train(args: argparse.Namespace) -> int:
    from fastrl_core.config import ConfigError, field_help
    from fastrl_core.run_config import load_config

    if args.list_keys:
        for key, text in field_help().items():
            print(f"  {key:24s} {text}")
        return 0
    config_path = None
    overrides = list(args.overrides)
    if overrides and "=" not in overrides[0]:
        config_path = overrides.pop(0)
    if args.method:  # the bench's definition of the method, under the command line's own overrides
        from fastrl_core.methods import METHODS

        if args.method not in METHODS:
            raise ConfigError(f"--method {args.method!r} is unknown; valid: {', '.join(METHODS)}")
        overrides = [*METHODS[args.method], *overrides]
    if args.resume is not None:  # the run's recorded config, under what this command line sets
        from fastrl_core.resume import load_resume_config

        config = load_resume_config(config_path, overrides, args.resume)
    else:
        config = load_config(config_path, overrides)
    from fastrl_core.resume import resume_command
    from fastrl_core.trainer import Trainer

    allow = [key for keys in args.allow_change or () for key in keys.split(",") if key]
    trainer = Trainer(config, resume=args.resume, allow_change=allow)
    try:
        run_id = trainer.run()
    except KeyboardInterrupt as error:
        run_id = trainer.writer.run_id
        error.add_note(f"run {run_id} is marked stopped; `{resume_command(config.store_dir, run_id)}` continues it")
        raise
    print(f"run {run_id} finished; store: {config.store_dir}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from fastrl_core.config import ConfigError
    from fastrl_core.data.problems import load_problems, text_limit
    from fastrl_core.data.templates import TEMPLATES
    from fastrl_core.run_config import check_model, check_source, model_context

    if args.template not in TEMPLATES:  # before any dataset or model loads
        raise ConfigError(f"--template {args.template!r} is unknown; valid: {', '.join(sorted(TEMPLATES))}")
    check_model("--model", str(args.model))
    check_source("--dataset", args.dataset, "synthetic")
    if args.max_text_chars is not None and args.max_text_chars < 1:
        raise ConfigError(f"--max-text-chars {args.max_text_chars}: must be at least 1")
    max_text_chars = args.max_text_chars or text_limit(model_context(str(args.model)))
    from fastrl_core.evaluate import evaluate
    from fastrl_core.named_models import model_path
    from fastrl_core.policy import load_policy
    from fastrl_core.store import RunWriter

    if args.dataset == "synthetic":
        from fastrl_core.data.synthetic import ensure_dataset

        problems = load_problems(ensure_dataset(Path(args.store) / "data") / args.split, limit=args.limit,
                                 max_text_chars=max_text_chars)
    else:
        problems = load_problems(args.dataset, split=args.split, limit=args.limit, skip_bad=args.skip_bad,
                                 allow_outside_paths=args.allow_outside_paths, max_text_chars=max_text_chars)
    policy = load_policy(model_path(str(args.model)))
    result = evaluate(policy, problems, template=args.template, batch_size=args.batch_size)
    writer = RunWriter(args.store, name=f"eval-{Path(str(args.model)).name}", config=vars(args), model=str(args.model),
                       dataset=args.dataset, objective="-", pruner="-", budget="-")
    writer.write_eval(0, args.split, result["accuracy"], result["n"], format_rate=result["format_rate"])
    writer.finish()
    print(f"accuracy {result['accuracy']:.4f}  format {result['format_rate']:.4f}  n={result['n']}")
    for kind, accuracy in sorted(result.get("per_kind", {}).items()):
        print(f"  {kind:20s} {accuracy:.4f}")
    return 0


def _warmstart(args: argparse.Namespace) -> int:
    from fastrl_core.named_models import main

    return main(args.rest) or 0


def _data(args: argparse.Namespace) -> int:
    from fastrl_core.data.synthetic import write_dataset

    path = write_dataset(Path(args.out), n_train=args.n_train, n_test=args.n_test, seed=args.seed)
    print(f"wrote {path}")
    return 0


def _store(args: argparse.Namespace) -> int:
    from fastrl_core.store import compact, damaged_files, read_runs

    runs = [args.run] if args.run else read_runs(args.store_dir)["run_id"].tolist()
    for run_id in runs:
        print(f"{run_id}: {compact(args.store_dir, run_id)}")
    for path, problem in damaged_files(args.store_dir).items():
        print(f"skipped damaged file {path}: {problem}  (`fastrl store check --quarantine` moves it aside)")
    return 0


def _store_check(args: argparse.Namespace) -> int:
    from fastrl_core.store.check import run_check

    return run_check(Path(args.store_dir), quarantine_files=args.quarantine)


def _app(args: argparse.Namespace) -> int:
    from fastrl_app.launch import serve

    process = serve(Path(args.store), port=args.port, address=args.address, timeout=60)  # returns once healthy
    try:
        print(f"FastRL dashboard: http://{args.address}:{args.port}  (store: {args.store}; Ctrl-C stops)")
        return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        process.terminate()
        process.wait(timeout=10)


def _demo(args: argparse.Namespace) -> int:
    from fastrl_app.demo import run_demo

    return run_demo(store=Path(args.store), port=args.port, address=args.address, steps=args.steps,
                    overrides=args.overrides)


def _report(args: argparse.Namespace) -> int:
    from fastrl_app.report import write_report

    path = write_report(Path(args.store), Path(args.out), run_id=args.run)
    print(f"wrote {path}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from fastrl_app.bench import main

    return main(args.rest) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastrl", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="on an error, show the traceback (may be given anywhere)")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("train", help="train with a YAML config and key=value overrides")
    p.add_argument("overrides", nargs="*", help="[CONFIG] key=value ... (CONFIG: a shipped config's name, "
                   f"{', '.join(config_names())}, or a YAML file; keys: --list-keys)")
    p.add_argument("--resume", metavar="RUN_ID", help="continue RUN_ID exactly from its newest whole checkpoint, under "
                   "its recorded config (a config file and overrides may be left out; one that differs from the "
                   "record is refused unless --allow-change names it)")
    p.add_argument("--allow-change", metavar="KEY[,KEY...]", action="append", help="with --resume: let these keys "
                   "differ from the run's record; the change is recorded in its config history from the step it "
                   "resumes at (model, dataset, seed, prompts_per_step, rollouts_per_prompt, budget, ... never "
                   "change)")
    p.add_argument("--method", metavar="NAME", help="a bench method's settings (grpo, fastrl, cppo, ...: "
                   "fastrl_core/configs/methods.yaml) under the overrides given")
    p.add_argument("--list-keys", action="store_true", help="print every config key with its help and exit")
    p.set_defaults(func=_train)

    p = commands.add_parser("eval", help="greedy accuracy of a model on a split; result into the store")
    p.add_argument("--model", default="embedded", help="'embedded', 'embedded-wide', a hub name or a local path "
                   "(default: %(default)s)")
    p.add_argument("--dataset", default="synthetic", help="'synthetic', a problems.jsonl folder, a Parquet/JSONL file "
                   "or a hub dataset (default: %(default)s)")
    p.add_argument("--split", default="test", help="the split to score (default: %(default)s)")
    p.add_argument("--template", default="math", help="prompt template: math, r1v or short (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="score only the first N problems (default: all)")
    p.add_argument("--batch-size", type=int, default=64, help="problems generated at once (default: %(default)s)")
    p.add_argument("--skip-bad", action="store_true", help="skip bad rows (counted) instead of failing")
    p.add_argument("--allow-outside-paths", action="store_true", help="let the dataset's image paths lead outside "
                   "its folder (absolute, '..', symlinks); without it such a row is a bad row")
    p.add_argument("--max-text-chars", type=int, default=None, help="longest question or answer in characters; a "
                   "longer row is a bad row (default: from the model's context, as `fastrl train` sets it)")
    p.add_argument("--store", default="runs", help="store directory the result is written to (default: %(default)s)")
    p.set_defaults(func=_eval)

    p = commands.add_parser("warmstart", help="supervised warm start of the embedded tiny VLM")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="its own options (`fastrl warmstart --help` lists them)")
    p.set_defaults(func=_warmstart)

    p = commands.add_parser("data", help="write the synthetic geometry dataset")
    p.add_argument("--out", required=True, help="folder the dataset is written to")
    p.add_argument("--n-train", type=int, default=2048, help="training problems (default: %(default)s)")
    p.add_argument("--n-test", type=int, default=256, help="test problems (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the problems drawn (default: %(default)s)")
    p.set_defaults(func=_data)

    p = commands.add_parser("store", help="store maintenance")
    store_commands = p.add_subparsers(dest="store_command", required=True)
    c = store_commands.add_parser("compact", help="materialise runs into single DuckDB files")
    c.add_argument("store_dir", help="the store directory")
    c.add_argument("--run", default=None, help="compact only this run id (default: every run)")
    c.set_defaults(func=_store)
    c = store_commands.add_parser("check", help="list damaged store files (exit 1 if any); --quarantine moves them "
                                  "to <store_dir>/quarantine/")
    c.add_argument("store_dir", help="the store directory")
    c.add_argument("--quarantine", action="store_true", help="move each damaged file to <store_dir>/quarantine/")
    c.set_defaults(func=_store_check)

    for name, func, text in (("app", _app, "serve the dashboard"),
                             ("demo", _demo, "train FastRL and GRPO interleaved (the shipped config demo) with "
                                             "the live dashboard")):
        p = commands.add_parser(name, help=text)
        p.add_argument("--store", default="runs", help="store directory the dashboard reads"
                       + (" and the runs are written to" if name == "demo" else "") + " (default: %(default)s)")
        p.add_argument("--port", type=int, default=8501, help="port the dashboard serves on; a port another "
                       "process listens on is refused (default: %(default)s)")
        p.add_argument("--address", default="127.0.0.1", help="address the dashboard serves on; 0.0.0.0 serves "
                       "every network interface (default: %(default)s, this machine only)")
        if name == "demo":
            p.add_argument("--steps", type=int, default=None, help="training steps per run (default: the demo config)")
            p.add_argument("overrides", nargs="*", help="key=value overrides of the demo config")
        p.set_defaults(func=func)

    p = commands.add_parser("report", help="write the Demo page as one self-contained HTML file")
    p.add_argument("--store", default="runs", help="store directory the runs are read from (default: %(default)s)")
    p.add_argument("--out", default="demo.html", help="the HTML file written (default: %(default)s)")
    p.add_argument("--run", default=None, help="the FastRL run (default: the newest with pruner fastrl)")
    p.set_defaults(func=_report)

    p = commands.add_parser("bench", help="side-by-side benchmark of GRPO, baselines and FastRL")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="its own options (`fastrl bench --help` lists them)")
    p.set_defaults(func=_bench)
    return parser


# Commands with their own argument parser get the rest of the command line untouched.
PASSTHROUGH = {"warmstart": _warmstart, "bench": _bench}


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the user's input is wrong (their message says how), not that the code is."""
    from fastrl_core.checkpoints import DamagedCheckpoint
    from fastrl_core.config import ConfigError
    from fastrl_core.data.problems import DataError
    from fastrl_app.launch import PortTaken
    from fastrl_core.store import RunLocked

    return ConfigError, DataError, DamagedCheckpoint, FileNotFoundError, RunLocked, PortTaken


def _disk_full(error: BaseException) -> bool:
    """A full disk, however the writing library words it (OSError errno 28, Arrow's and safetensors' texts)."""
    return (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        text in str(error) for text in ("No space left on device", "StorageFull", "Disk quota exceeded"))


def one_line(error: BaseException) -> str:
    """`error`'s message on one line (a KeyError's message without the quotes str() adds)."""
    message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(message).split()) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    argv = [arg for arg in argv if arg != "--debug"]
    try:
        if argv and argv[0] in PASSTHROUGH:
            return PASSTHROUGH[argv[0]](argparse.Namespace(rest=argv[1:]))
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)  # train's overrides may follow its options (--method ...)
        if extra and (args.command != "train" or any(arg.startswith("-") for arg in extra)):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if extra:
            args.overrides = [*args.overrides, *extra]
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit, so a reader gone away is caught below
        return code
    except BrokenPipeError:  # the reader of stdout went away (`| head`): stop writing, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush writes nowhere
        return 141
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGTERM while training (run_loop.Stopped)
        if debug:
            raise
        from fastrl_core.run_loop import Stopped

        notes = getattr(error, "__notes__", [])  # `fastrl train` names its run and the command that continues it
        print(f"fastrl: {one_line(error) if isinstance(error, Stopped) else 'stopped by SIGINT (Ctrl-C)'}; "
              f"{notes[-1] if notes else 'unfinished runs are marked stopped'}", file=sys.stderr)
        return 143 if isinstance(error, Stopped) else 130
    except Exception as error:
        if debug or not (isinstance(error, _user_errors()) or _disk_full(error)):
            raise
        print(f"fastrl: error: {one_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
