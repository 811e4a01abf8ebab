#!/usr/bin/env python
"""The bookkeeping of `ootd batch` from 10^2 to 10^6 pairs, with the model replaced by an INSTANT STAND-IN.

This is not a model benchmark: the try-on's model is a stand-in that returns a 48x64 picture at once, so what is
timed is everything around the model - reading and checking the pairs, resume, the try-on sequence's own
bookkeeping, saving each PNG (through the real atomic writer, record and fsync included), the JSON-lines report,
the contact sheet and the progress display - through the real `ootd batch` command, in this process.

Each (engine, case, n) runs in a fresh process, so its peak resident memory is its own:

- fail: every row fails fast (half name a missing person photo, half have no category); nothing is loaded.
- ok:   every pair runs on the stand-in (a catalogue: n/100 people x 100 garments) into an empty folder.
- done: the same command again on that folder: every pair is found done and skipped (a resume).

    python scripts/bench_batch_overhead.py                              # 10^2 .. 10^5, local; 10^4 on Ray
    python scripts/bench_batch_overhead.py --sizes 100,1000 --ray none --browser
    python scripts/bench_batch_overhead.py --sizes 10000,1000000 --ray 10000,1000000 --cases ok  # flat memory
    python scripts/bench_batch_overhead.py --json results.json

It prints, per run: wall time, the set-up before the first pair (imports, options), the time per pair after it,
the CPU time, peak RSS (the driver's: Ray's workers are processes of their own), and each component's share of
the wall time (exclusive: a component's time does not include the components it calls); then, per engine and
case, the cost of a pair at the largest size against the smallest (wall after set-up, and CPU), a ratio.
`--browser` opens the contact sheet of each `ok` run in Debian's headless
chromium (as tests/frontends/serve/test_page.py does) and reports the front page's size and load time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

GARMENTS = 100  # a catalogue: n/100 people x 100 garments
COMPONENTS = ("options", "pairs", "checks", "try-on", "model", "saving", "report", "index", "display")
STAND_IN = ("STAND-IN MODEL: every try-on returns a 48x64 picture at once (no diffusion model runs); the figures "
            "are the bookkeeping around the model, not the model.")


# ---------------------------------------------------------------------------------------------- timing


class Components:
    """Exclusive wall time per component: a nested call's time is its own component's, not its caller's."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(COMPONENTS, 0.0)
        self.calls = dict.fromkeys(COMPONENTS, 0)
        self.first_pair: float | None = None  # when the first pair's report was written
        self.first_cpu = 0.0  # this process's CPU seconds by then
        self._local = threading.local()

    def wrap(self, component: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                nested = stack.pop()
                self.seconds[component] += elapsed - nested
                self.calls[component] += 1
                if stack:
                    stack[-1] += elapsed

        timed.__name__ = getattr(fn, "__name__", "timed")
        return timed

    def patch(self, component: str, owner: Any, name: str) -> None:
        setattr(owner, name, self.wrap(component, getattr(owner, name)))


def instrument(components: Components) -> None:
    """Time the batch machinery's parts where they are looked up (module globals and class attributes)."""
    import ootd.app.batch.pairs as pairs
    import ootd.app.batch.precheck as precheck
    import ootd.app.batch.runner as runner
    import ootd.cli.batch as cli_batch
    import ootd.cli.options as cli_options
    from ootd.app.batch.index import ContactIndex
    from ootd.app.batch.report import ReportWriter
    from ootd.app.tryon.job import TryOnJob
    from ootd.cli.display import Display

    components.patch("pairs", pairs, "collect_pairs")
    components.patch("checks", precheck, "check_batch_outputs")
    for name in ("precheck", "check_batch"):
        components.patch("checks", runner, name)
    components.patch("options", cli_options, "checked_config")  # imports torch (the device check)
    components.patch("try-on", TryOnJob, "run")
    components.patch("saving", TryOnJob, "save")
    for name in ("open", "write", "close"):
        components.patch("report", ReportWriter, name)
    for name in ("__init__", "add", "refresh", "finish", "_timed"):
        components.patch("index", ContactIndex, name)
    components.patch("display", cli_batch.PairLog, "write")
    components.patch("display", cli_batch, "echo_err")
    for name in ("__call__", "print", "reset"):
        components.patch("display", Display, name)
    write = ReportWriter.write

    def first(self: Any, entry: dict[str, Any]) -> None:
        if components.first_pair is None:
            components.first_pair = time.perf_counter()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            components.first_cpu = usage.ru_utime + usage.ru_stime
        write(self, entry)

    ReportWriter.write = first


def standin_class(components: Components | None) -> type:
    """The stand-in pipeline: the try-on methods a pipeline has, instant, inputs never read."""
    from PIL import Image

    from ootd.pipeline_types import TryOnResult
    from ootd.settings import ModelType
    from ootd.speedups.modes import SpeedModes

    def timed(fn: Any) -> Any:
        return components.wrap("model", fn) if components is not None else fn

    class InstantPipe:
        """STAND-IN: not a model. 48x64 pictures at once."""

        def __init__(self, model_type: Any) -> None:
            self.model_type = ModelType(str(getattr(model_type, "value", model_type)))
            self.device = SimpleNamespace(type="cpu", torch_device="cpu", name="stand-in", arch="stand-in")
            self.precision = SimpleNamespace(unet="torch.float32")
            self.modes = SpeedModes()

        @timed
        def prepare_person(self, person: Any, category: Any, **_: Any) -> Any:
            return SimpleNamespace(category=category, auto=False)

        @timed
        def encode_person(self, masked: Any) -> Any:
            return SimpleNamespace(category=masked.category, auto=True)

        @timed
        def prepare_garment(self, garment: Any, category: Any, **_: Any) -> Any:
            return SimpleNamespace(category=category)

        @timed
        def generate(self, person: Any, garment: Any, settings: Any, progress: Any = None, modes: Any = None,
                     **_: Any) -> Any:
            if progress is not None:
                progress("denoise", 1, 1)
            images = [Image.new("RGB", (48, 64), (settings.seed % 256, 40 * i % 256, 7))
                      for i in range(settings.num_samples)]
            blank = Image.new("L", (48, 64), 255)
            return TryOnResult(images=images, mask=blank, masked_person=blank, seed=settings.seed,
                               model_type=self.model_type, category=person.category, sampling=settings,
                               modes=modes or self.modes)

    return InstantPipe


def use_standin_on_ray() -> None:
    """The Ray workers build their runner with the stand-in too (their loader takes the models of an enclosing
    `use_models` when it is made)."""
    import ootd.app.batch.ray_engine as ray_engine
    from ootd.models import use_models

    base = ray_engine.PairWorker

    class StandInWorker(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with use_models(standin_class(None)):
                super().__init__(*args, **kwargs)

    ray_engine.PairWorker = StandInWorker


# ---------------------------------------------------------------------------------------------- inputs


def make_inputs(work: Path, n: int) -> dict[str, Path]:
    """A catalogue (people x garments, tiny PNGs) and two pairs files of n rows: all good, all failing."""
    from PIL import Image

    people, garments = work / "people", work / "garments"
    for folder in (people, garments):
        folder.mkdir(parents=True, exist_ok=True)
    count = max(1, -(-n // GARMENTS))
    for i in range(count):
        path = people / f"p{i:05d}.png"
        if not path.exists():
            Image.new("RGB", (6, 8), (i % 256, 90, 90)).save(path)
    for j in range(GARMENTS):
        path = garments / f"g{j:03d}.png"
        if not path.exists():
            Image.new("RGB", (6, 8), (90, j % 256, 90)).save(path)
    good, bad = work / f"ok{n}.csv", work / f"fail{n}.csv"
    good.write_text("".join(f"people/p{i // GARMENTS:05d}.png,garments/g{i % GARMENTS:03d}.png,upper\n"
                            for i in range(n)))
    bad.write_text("".join(f"people/missing{i:06d}.png,garments/g000.png,upper\n" if i % 2 == 0
                           else f"people/p00000.png,garments/g{i % GARMENTS:03d}.png,\n" for i in range(n)))
    return {"ok": good, "done": good, "fail": bad}


# ---------------------------------------------------------------------------------------------- one run


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One `ootd batch` in this process, timed by component; returns the figures."""
    start = time.perf_counter()
    components = Components()
    from ootd import cli
    from ootd.models import use_models

    instrument(components)
    if spec["display"] == "bars":
        bars_on_a_null_terminal()
    args = ["batch", spec["csv"], "-o", spec["out"], "--checkpoints", spec["checkpoints"], "--seed", "1",
            "--steps", "1", "--resolution", "384x512"]
    if spec["engine"] == "ray":
        use_standin_on_ray()
        args += ["--engine", "ray", "--workers", str(spec["workers"]), "--gpus-per-worker", "0"]
    code = 0
    with use_models(standin_class(components)):
        try:
            cli.main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    first = components.first_pair
    setup = (first - start) if first is not None else wall
    cpu = usage.ru_utime + usage.ru_stime
    return {**spec, "code": code, "wall": wall, "setup": setup, "cpu": cpu,
            "cpu_after_setup": cpu - components.first_cpu if first is not None else 0.0,
            "peak_rss_mb": usage.ru_maxrss / 1024, "components": components.seconds, "calls": components.calls}


def bars_on_a_null_terminal() -> None:
    """Progress bars as a person at a terminal sees them, drawn into /dev/null."""
    from rich.console import Console

    import ootd.cli.batch as cli_batch

    null = open(os.devnull, "w")  # noqa: SIM115 - for the life of this process
    base = cli_batch.Display

    class NullTerminal(base):  # type: ignore[misc, valid-type]
        def __init__(self, enabled: bool, console: Any = None) -> None:
            super().__init__(enabled, Console(file=null, force_terminal=True, width=120))

    cli_batch.Display = NullTerminal
    cli_batch.show_progress = lambda quiet, json_out: True


def run_child(spec: dict[str, Any], work: Path) -> dict[str, Any]:
    result = work / "result.json"
    result.unlink(missing_ok=True)
    log = work / f"stderr-{spec['engine']}-{spec['case']}-{spec['n']}.txt"
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec), "--result", str(result)],
                              stdout=subprocess.DEVNULL, stderr=err, cwd=REPO_ROOT, timeout=spec["timeout"])
    if proc.returncode != 0 or not result.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"error: the {spec['case']} run at n={spec['n']} failed (exit {proc.returncode}): {tail}")
    return json.loads(result.read_text())


# ---------------------------------------------------------------------------------------------- browser


def open_in_browser(index: Path) -> dict[str, Any]:
    """The front page (and the first page of the grid, if any) in headless chromium: size and load time."""
    from selenium import webdriver

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        return {"skipped": "chromium or chromedriver not installed (scripts/install_browser.sh)"}
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    figures: dict[str, Any] = {}
    try:
        driver.get("about:blank")
        pages = [("front", index)]
        first_page = index.with_name(f"{index.stem}_files") / "page-0001.html"
        if first_page.exists():
            pages.append(("page 1", first_page))
        for label, path in pages:
            start = time.perf_counter()
            driver.get(path.as_uri())
            wall = time.perf_counter() - start
            load = driver.execute_script("const t = performance.timing; return t.loadEventEnd - t.navigationStart;")
            figures[label] = {"bytes": path.stat().st_size, "load_ms": load, "get_s": round(wall, 3),
                              "scroll_width": driver.execute_script("return document.documentElement.scrollWidth")}
    finally:
        driver.quit()
    return figures


# ---------------------------------------------------------------------------------------------- table


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def row(result: dict[str, Any]) -> str:
    n, wall, setup = result["n"], result["wall"], result["setup"]
    comps = result["components"]
    model = comps["model"]
    per_pair = (wall - setup) / n * 1000
    bookkeeping = (wall - model) / n * 1000
    shares = " | ".join(f"{100 * comps[c] / wall:.0f}%" for c in COMPONENTS)
    other = wall - sum(comps.values())
    return (f"| {result['engine']} | {result['case']} | {n:,} | {result['code']} | {wall:.1f} | {setup:.1f} | "
            f"{per_pair:.2f} | {bookkeeping:.2f} | {result['cpu']:.1f} | {result['peak_rss_mb']:.0f} | {shares} | "
            f"{100 * max(0.0, other) / wall:.0f}% |")


def ratio_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per engine and case: a pair's cost at the largest size over its cost at the smallest (1.0: flat)."""
    lines = []
    for engine in dict.fromkeys(r["engine"] for r in results):
        for case in dict.fromkeys(r["case"] for r in results):
            runs = sorted((r for r in results if (r["engine"], r["case"]) == (engine, case)), key=lambda r: r["n"])
            if len(runs) < 2:
                continue
            small, big = runs[0], runs[-1]
            wall = [(r["wall"] - r["setup"]) / r["n"] for r in (small, big)]
            cpu = [r["cpu_after_setup"] / r["n"] for r in (small, big)]
            lines.append(f"{engine} {case}: a pair at {big['n']:,} costs {wall[1] / wall[0]:.2f}x its cost at "
                         f"{small['n']:,} after set-up ({wall[1] * 1000:.2f} against {wall[0] * 1000:.2f} ms), "
                         f"{cpu[1] / cpu[0]:.2f}x in CPU after set-up ({cpu[1] * 1000:.2f} against "
                         f"{cpu[0] * 1000:.2f} ms); peak RSS {big['peak_rss_mb']:.0f} MB against "
                         f"{small['peak_rss_mb']:.0f} MB")
    return lines


HEADER = ("| engine | case | pairs | exit | wall s | set-up s | ms/pair after set-up | bookkeeping ms/pair | CPU s | "
          "peak RSS MB | " + " | ".join(COMPONENTS) + " | other |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="pair counts, comma-separated")
    parser.add_argument("--cases", default="fail,ok,done", help="fail, ok, done (done needs ok first)")
    parser.add_argument("--ray", default="10000", help="pair counts for the Ray engine, or none")
    parser.add_argument("--ray-workers", type=int, default=2)
    parser.add_argument("--display", choices=("lines", "bars"), default="lines",
                        help="lines: stderr is a file (nohup); bars: progress bars drawn to a null terminal")
    parser.add_argument("--checkpoints", type=Path, help="a checkpoints tree (default: a tiny one, made once)")
    parser.add_argument("--work", type=Path, help="where inputs and outputs go (default: a temporary folder)")
    parser.add_argument("--browser", action="store_true", help="open each ok run's contact sheet in chromium")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per run")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.result.write_text(json.dumps(child(json.loads(args.child))))
        return 0
    try:
        sizes = [int(x) for x in args.sizes.split(",") if x]
        ray_sizes = [] if args.ray == "none" else [int(x) for x in args.ray.split(",") if x]
    except ValueError:
        parser.error("--sizes and --ray take comma-separated numbers (or --ray none)")
    cases = [c for c in args.cases.split(",") if c]
    if not set(cases) <= {"fail", "ok", "done"} or ("done" in cases and "ok" not in cases) or \
            any(n < 1 for n in sizes + ray_sizes):
        parser.error("--cases takes fail, ok, done (done needs ok); sizes must be positive")
    work = args.work or Path(tempfile.mkdtemp(prefix="ootd-bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    print(STAND_IN)
    print(f"machine: {os.cpu_count()} CPUs; work folder {work}; display: {args.display}; {load_average()}")
    print(HEADER)
    print("|" + "---|" * (11 + len(COMPONENTS)))
    plan = [("local", n) for n in sizes] + [("ray", n) for n in ray_sizes]
    results = run_plan(plan, cases, work, args.checkpoints or tiny_checkpoints(work), args)
    for line in ratio_lines(results):
        print(line)
    print(f"done; {load_average()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def tiny_checkpoints(work: Path) -> Path:
    """A tiny random-weight checkpoints tree (the batch checks the files are there; the stand-in loads none)."""
    checkpoints = work / "checkpoints"
    if not (checkpoints / "ootd").exists():
        sys.path.insert(0, str(REPO_ROOT / "scripts"))
        from make_tiny_checkpoints import make_tiny_checkpoints

        make_tiny_checkpoints(checkpoints)
    return checkpoints


def run_plan(plan: list[tuple[str, int]], cases: list[str], work: Path, checkpoints: Path,
             args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each (engine, n) with each case, one fresh process per run; a line of the table as each one ends."""
    results = []
    for engine, n in plan:
        csvs = make_inputs(work, n)
        out = work / f"out-{engine}-{n}"
        shutil.rmtree(out, ignore_errors=True)
        for case in cases:
            target = out if case != "fail" else work / f"out-{engine}-fail-{n}"
            if case == "fail":
                shutil.rmtree(target, ignore_errors=True)
            spec = {"engine": engine, "case": case, "n": n, "csv": str(csvs[case]), "out": str(target),
                    "checkpoints": str(checkpoints), "display": args.display, "workers": args.ray_workers,
                    "timeout": args.timeout}
            result = run_child(spec, work)
            result["load_average"] = os.getloadavg()
            if args.browser and case == "ok":
                result["browser"] = open_in_browser(target / "index.html")
            results.append(result)
            print(row(result), flush=True)
            if "browser" in result:
                print(f"  contact sheet in chromium: {json.dumps(result['browser'])}", flush=True)
        if args.work is None:
            shutil.rmtree(out, ignore_errors=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
