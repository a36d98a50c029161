"""``ferroplasma records …`` and ``ferroplasma dataframe sort``: the jobs
from the command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any

from ..client import Client
from ..errors import FerroplasmaError, JobError, StoreUnavailable
from .pool import default_socket

RECORDS_HELP = """\
Sort 100-byte text records with map/reduce on the store: the workload of
"Plasma Map/Reduce Slightly Faster Than Hadoop" (Gerd Stolpmann, 2012).

A record is one line: an 8-byte key, TAB, 90 bytes, LF. Keys compare as
bytes (like LC_ALL=C sort).

  ferroplasma records gen --size 10GiB --files 10 --out /data/in
  ferroplasma records sort --input /data/in --output /data/out --partitions 80
  ferroplasma records validate --input /data/in --output /data/out

`sort` uses the store at --socket; when none runs there it starts a
private one for the job and says so. Runs that do not fit in the store
spill to files next to the output.
"""

DATAFRAME_HELP = """\
Sort a table by columns with the parallel sample sort on the store, as
described in "Plasma In-Memory Object Store" (Philipp Moritz and Robert
Nishihara, 2017).

  ferroplasma dataframe sort --input t.parquet --by key --output sorted.parquet
  ferroplasma dataframe sort --objects ID,ID,... --by a,b --descending b

With --input (Parquet, Feather or CSV) the table is split into --partitions
DataFrames in the store; with --objects the partitions are DataFrames
already there (their ids, in order). With --output the sorted table is
written there; otherwise the ids of the sorted buckets are printed (and left
in the store).
"""


def _progress_factory(enabled: bool):
    """A bar per phase: tqdm (bytes, with throughput) when it is installed
    and stderr is a terminal; a plain line per 10 % otherwise (a log file
    gets no carriage returns); nothing when not ``enabled``."""
    if not enabled:
        return None
    if not sys.stderr.isatty():
        return _LineProgress
    try:
        from tqdm import tqdm
    except ImportError:
        return _LineProgress

    def make(what: str, total: int) -> Any:
        return tqdm(total=total, desc=f"{what:>8}", unit="B", unit_scale=True, unit_divisor=1000)

    return make


class _LineProgress:
    """Progress as a line per 10 % (no tqdm installed)."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done, self.next_pct = what, max(total, 1), 0, 10
        self.start = time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n
        pct = 100 * self.done // self.total  # integers: no step lost to rounding
        if pct >= self.next_pct:
            rate = self.done / 1e6 / max(time.perf_counter() - self.start, 1e-9)
            print(f"{self.what}: {pct:3d}% ({rate:.0f} MB/s)", file=sys.stderr)
            self.next_pct = pct - pct % 10 + 10

    def close(self) -> None:
        pass


def _say(text: str) -> None:
    print(f"ferroplasma: {text}", file=sys.stderr)


def _dask_client(address: str):
    """A client of the Dask scheduler at ``address``, or a clear error."""
    from .._optional import require

    require("ferroplasma records sort --scheduler", "dask", "distributed")
    import distributed

    try:
        return distributed.Client(address, timeout=10)
    except OSError as e:
        raise JobError(f"no Dask scheduler answers at {address}: {e}") from e


def _common(p: argparse.ArgumentParser, store: bool) -> None:
    p.add_argument(
        "--workers", type=int, help="worker processes (default: the cores, %(default)s here)"
    )
    p.set_defaults(workers=os.cpu_count())
    if store:
        p.add_argument(
            "--socket",
            default=default_socket(),
            help="store to run on (default: $FERROPLASMA_SOCKET or /tmp/ferroplasma.sock, "
            "now %(default)s); a private store is started if none runs there",
        )
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def records_main(argv: list[str]) -> int:
    """``ferroplasma records``; returns the exit code."""
    from . import records

    p = argparse.ArgumentParser(
        prog="ferroplasma records",
        description=RECORDS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{gen,sort,validate}")
    g = sub.add_parser("gen", help="write seeded random record files")
    g.add_argument("--size", required=True, help="total bytes, e.g. 10GiB or 500MB")
    g.add_argument("--files", type=int, default=10, help="files to write (default %(default)s)")
    g.add_argument("--out", required=True, help="directory to write records-NNNNN.txt into")
    g.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    _common(g, store=False)
    s = sub.add_parser("sort", help="sort a directory of record files into partitions")
    s.add_argument("--input", required=True, help="directory of record files")
    s.add_argument("--output", required=True, help="directory for part-NNNNN files")
    s.add_argument("--partitions", type=int, default=80, help="output files (default %(default)s)")
    s.add_argument(
        "--split-size",
        default="128MiB",
        help="bytes each map task reads (default %(default)s)",
    )
    s.add_argument("--spill-dir", help="where runs that do not fit go (default: in --output)")
    s.add_argument(
        "--overwrite", action="store_true", help="remove part-* files already in --output first"
    )
    s.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the tasks on this Dask cluster (e.g. tcp://host:8786) instead of local "
        "processes: every worker's host runs a store of one cluster, and --input and "
        "--output are visible to every worker (docs/jobs.md; needs pip install '.[dask]')",
    )
    s.add_argument(
        "--local-inputs",
        action="store_true",
        help="with --scheduler: every host has files of its own in --input (the same path, "
        "other files, e.g. local disks); each is read on its host only",
    )
    _common(s, store=True)
    v = sub.add_parser("validate", help="check a sort's output against its input")
    v.add_argument("--input", required=True, help="the directory that was sorted")
    v.add_argument("--output", required=True, help="the sort's output directory")
    _common(v, store=False)
    args = p.parse_args(argv)
    progress = _progress_factory(not args.quiet)
    try:
        if args.command == "gen":
            t = time.perf_counter()
            paths = records.gen_records(
                args.out, args.size, args.files, args.seed, args.workers, progress
            )
            size = sum(os.path.getsize(x) for x in paths)
            dt = time.perf_counter() - t
            print(
                f"wrote {size / 1e9:.2f} GB in {len(paths)} files to {args.out} in {dt:.1f} s "
                f"({size / 1e6 / dt:.0f} MB/s)"
            )
        elif args.command == "sort":
            summary = records.sort_records(
                args.input,
                args.output,
                args.partitions,
                _dask_client(args.scheduler) if args.scheduler else args.workers,
                args.socket,
                args.split_size,
                args.spill_dir,
                progress,
                _say,
                args.overwrite,
                args.local_inputs,
            )
            print(summary)
        else:
            report = records.validate_records(args.input, args.output, args.workers, progress)
            print(report)
            return 0 if report.ok else 1
    except (FerroplasmaError, OSError) as e:
        print(f"ferroplasma records {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        left = "; no part files were written" if args.command == "sort" else ""
        print(f"ferroplasma records {args.command}: interrupted{left}", file=sys.stderr)
        return 130
    return 0


def _read_table(path: str):
    import pyarrow.csv
    import pyarrow.feather
    import pyarrow.parquet

    if not os.path.exists(path):
        raise JobError(f"input {path!r} does not exist")
    lower = path.lower()
    if lower.endswith((".csv", ".csv.gz", ".tsv")):
        opts = pyarrow.csv.ParseOptions(delimiter="\t" if lower.endswith(".tsv") else ",")
        return pyarrow.csv.read_csv(path, parse_options=opts).to_pandas()
    if lower.endswith((".feather", ".arrow", ".ipc")):
        return pyarrow.feather.read_table(path).to_pandas()
    return pyarrow.parquet.read_table(path).to_pandas()


def dataframe_main(argv: list[str]) -> int:
    """``ferroplasma dataframe``; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="ferroplasma dataframe",
        description=DATAFRAME_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="{sort}")
    s = sub.add_parser("sort", help="sort a table by columns on the store")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="a Parquet, Feather or CSV file")
    src.add_argument("--objects", help="ids of DataFrames in the store, comma separated")
    s.add_argument("--by", required=True, help="column(s) to sort by, comma separated")
    s.add_argument("--descending", default="", help="those of the --by columns to sort descending")
    s.add_argument("--partitions", type=int, help="with --input: partitions (default: workers)")
    s.add_argument("--buckets", type=int, help="sorted buckets (default: as many as partitions)")
    s.add_argument("--output", help="write the sorted table here (Parquet)")
    s.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run the tasks on this Dask cluster (e.g. tcp://host:8786): every worker's host "
        "runs a store of one cluster (docs/jobs.md; needs pip install '.[dask]')",
    )
    _common(s, store=True)
    args = p.parse_args(argv)
    try:
        return _dataframe_sort(args)
    except (FerroplasmaError, OSError, ValueError) as e:
        print(f"ferroplasma dataframe sort: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ferroplasma dataframe sort: interrupted; nothing was written", file=sys.stderr)
        return 130


def _dataframe_sort(args: argparse.Namespace) -> int:
    import pandas as pd

    from .._ids import ObjectID
    from .dataframe import sort_dataframe
    from .pool import job_store

    by = [c for c in args.by.split(",") if c]
    desc = {c for c in args.descending.split(",") if c}
    unknown = desc - set(by)
    if unknown:
        raise JobError(f"--descending names {sorted(unknown)}, which are not --by columns")
    frame = _read_table(args.input) if args.input else None
    size = int(frame.memory_usage(deep=True).sum()) if frame is not None else 0
    if frame is None:
        # --objects: the partitions are in a running store; a private store
        # would hold none of them.
        try:
            Client(args.socket)
        except StoreUnavailable:
            raise JobError(
                f"no store answers at {args.socket}: --objects names DataFrames in a running "
                "store; pass the socket of the store that holds them (--socket)"
            ) from None
    with job_store(args.socket, max(256 * 2**20, 4 * size), _say) as client:
        if frame is not None:
            k = args.partitions or args.workers or 1
            edges = [len(frame) * i // k for i in range(k + 1)]
            parts = [client.put(frame.iloc[a:b]) for a, b in zip(edges, edges[1:])]
            del frame
        else:
            parts = [ObjectID.from_hex(x.strip()) for x in args.objects.split(",") if x.strip()]
        t = time.perf_counter()
        workers = _dask_client(args.scheduler) if args.scheduler else args.workers
        out = sort_dataframe(
            client, parts, by, workers, args.buckets, ascending=[c not in desc for c in by]
        )
        dt = time.perf_counter() - t
        if args.input:
            client.delete(parts)
        if args.output:
            import pyarrow as pa
            import pyarrow.parquet as pq

            frames = client.get(out)
            # Written under a temporary name, renamed when complete.
            temp = f"{args.output}.tmp-{os.getpid()}"
            try:
                pq.write_table(pa.Table.from_pandas(pd.concat(frames)), temp)
                os.replace(temp, args.output)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(temp)
            rows = sum(len(f) for f in frames)
            del frames
            client.delete(out)
            print(f"sorted {rows:,} rows in {dt:.2f} s into {args.output}")
        else:
            for oid in out:
                print(oid.hex())
            print(f"sorted in {dt:.2f} s: {len(out)} buckets in the store", file=sys.stderr)
    return 0
