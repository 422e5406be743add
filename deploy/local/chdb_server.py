#!/usr/bin/env python3
"""Serve a chdb-core ClickHouse engine over HTTP and native TCP on loopback.

chdb only embeds ClickHouse (clickhouse-local); it has no server mode. But
clickhouse-local accepts `SYSTEM START LISTEN HTTP/TCP`, and the listeners
live as long as the query that started them runs. So this launcher starts
the listeners, then runs a query that sleeps for ~31 years, and is stopped
with SIGTERM (which ends it at once; data is on disk already).

Why it is written the way it is (see shared LOCAL-STACK.md):
* It does NOT `import chdb`: that package initialises an embedded engine at
  import, and serving afterwards fails with "EventNotifier is initialized
  twice". Instead it loads `chdb/_chdb.abi3.so` itself, first through ctypes
  with RTLD_DEEPBIND (so the pybind11 stubs bind to chdb's own allocator, as
  chdb/__init__.py does), then as a Python extension module via importlib.
* clickhouse-local reads `./config.xml`, so it chdir's into --run-dir and
  writes one there binding 127.0.0.1 only; without it the ports fall back
  to 9000 on every address.
* The output format passed with the query becomes the HTTP interface's
  default: with TabSeparated a plain `SELECT 1` answers `1`.
* Errors (Code 210 address in use, Code 76 data folder locked) are printed
  by the engine to stderr only; stack.sh watches the log for them.

Uses only the standard library; run it with the venv's python.
"""

import argparse
import ctypes
import glob
import importlib.util
import os
import sys

# Never ends in practice (1e9 rows x 1 s). max_block_size=1 keeps each block
# under the engine's per-block sleep limit.
SLEEP_FOREVER = (
    "SELECT count() FROM numbers(1000000000) "
    "WHERE NOT ignore(sleepEachRow(1)) SETTINGS max_block_size = 1"
)


def find_chdb_so(venv):
    pattern = os.path.join(venv, "lib", "python3*", "site-packages", "chdb", "_chdb.abi3.so")
    hits = sorted(glob.glob(pattern))
    if not hits:
        sys.exit(f"chdb_server: no {pattern} (run deploy/local/install.sh)")
    return hits[-1]


def load_chdb(so_path):
    so_path = os.path.abspath(so_path)
    pkg_dir = os.path.dirname(so_path)
    # chdb/__init__.py loads the module with the package folder as cwd;
    # do the same so anything it resolves relative to cwd is found.
    old_cwd = os.getcwd()
    os.chdir(pkg_dir)
    try:
        ctypes.CDLL(so_path, mode=sys.getdlopenflags() | os.RTLD_DEEPBIND)
        spec = importlib.util.spec_from_file_location("_chdb", so_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        os.chdir(old_cwd)
    return module


# WEFT_CH_PROFILE=1: keep system.query_log and system.part_log, so that a benchmark can say
# which queries, inserts and merges the server's CPU went to (docs/BENCHMARKS.md).
PROFILE_LOGS = (
    "  <query_log><database>system</database><table>query_log</table>"
    "<flush_interval_milliseconds>1000</flush_interval_milliseconds></query_log>\n"
    "  <part_log><database>system</database><table>part_log</table>"
    "<flush_interval_milliseconds>1000</flush_interval_milliseconds></part_log>\n"
    if os.environ.get("WEFT_CH_PROFILE") == "1"
    else ""
)


def write_config(run_dir, http_port, tcp_port):
    config = (
        "<clickhouse>\n"
        "  <listen_host>127.0.0.1</listen_host>\n"
        f"  <http_port>{int(http_port)}</http_port>\n"
        f"  <tcp_port>{int(tcp_port)}</tcp_port>\n"
        + PROFILE_LOGS
        + "</clickhouse>\n"
    )
    path = os.path.join(run_dir, "config.xml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config)
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--tcp-port", type=int, required=True)
    p.add_argument("--data-dir", required=True, help="ClickHouse data folder (tables live here)")
    p.add_argument("--run-dir", required=True, help="working folder; config.xml is written here")
    p.add_argument(
        "--venv",
        default=os.environ.get("WEFT_VENV", os.path.expanduser("~/.cache/weft/venv")),
        help="venv holding chdb-core (default $WEFT_VENV or ~/.cache/weft/venv)",
    )
    p.add_argument("--chdb-so", help="explicit path to _chdb.abi3.so (overrides --venv)")
    args = p.parse_args()

    # Resolve before the chdir below changes what relative paths mean.
    data_dir = os.path.abspath(args.data_dir)
    run_dir = os.path.abspath(args.run_dir)
    so_path = os.path.abspath(args.chdb_so) if args.chdb_so else find_chdb_so(args.venv)
    os.makedirs(data_dir, exist_ok=True)
    os.makedirs(run_dir, exist_ok=True)

    chdb = load_chdb(so_path)
    os.chdir(run_dir)
    write_config(run_dir, args.http_port, args.tcp_port)
    print(
        f"chdb_server: pid {os.getpid()} serving {data_dir} on "
        f"http 127.0.0.1:{args.http_port} tcp 127.0.0.1:{args.tcp_port}",
        file=sys.stderr,
        flush=True,
    )

    sql = f"SYSTEM START LISTEN HTTP; SYSTEM START LISTEN TCP; {SLEEP_FOREVER}"
    try:
        chdb.query(sql, "TabSeparated", path=data_dir)
    except Exception as e:  # the engine's error text, e.g. Code 210 / Code 76
        print(f"chdb_server: query failed: {e}", file=sys.stderr, flush=True)
        return 1
    # Reaching here means the sleep query ended, and the listeners with it.
    # The engine does not raise: its error (if any) was printed to stderr
    # just above, so say so rather than guess.
    print(
        "chdb_server: the serving query ended (any engine error is printed above); exiting",
        file=sys.stderr,
        flush=True,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
