"""What the command line accepts: option values checked as argparse reads them (a mistake
names its option: "argument --for: ..."), and names checked against the app and its table.

Part of `synclane.cli`; kept apart so that the commands read as commands.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from synclane import loading
from synclane.app import OwnerSourceError, SyncLane, redact
from synclane.connection import creating_allowed
from synclane.model import MAX_DURATION, ConfigError, check_name, check_reason


class UsageError(Exception):
    """A mistake on the command line; printed as one line."""


class Stopped(BaseException):
    """SIGTERM or SIGHUP reached a command: it unwinds like Ctrl-C (no `except Exception` holds
    it), so that every `finally` and exit handler runs (the embedded PostgreSQL's stop among
    them); unlike Ctrl-C it is no interruption, and the page's server does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While a command runs: SIGTERM and SIGHUP raise Stopped (a worker that runs handles them
    itself, handing its jobs back first). The handlers before are put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    before = {}
    for sig in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
        if sig is not None:
            before[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


EPILOG = """\
The DSN comes from --dsn or $SYNCLANE_DSN (with neither: the embedded PostgreSQL), the app from
--app or $SYNCLANE_APP. `synclane COMMAND --help` shows a command's options and examples.

exit status: 0 done; 2 a mistake (one line says which option or name); 3 `work --until-idle` or
`plan --work` left jobs open or waiting for a human (the last lines say which and why);
1 an unexpected error (--traceback shows where); 130 interrupted by Ctrl-C (after the jobs
were handed back). SIGTERM and SIGHUP stop `work`, `demo` and `dashboard` as a stop asked for.
"""


MAX_LIMIT = 100_000  # rows `jobs` prints; more is a job for SQL or app.jobs()

# the options `dashboard` and `demo` share
PUBLIC_HOST_HELP = (
    "another name the page is reached by (a proxy's public name, this machine's address); "
    "repeat for several. The page answers only to its own address and these names"
)

REMOTE_HELP = (
    "listen on a host other machines can reach; needs a login secret of 16+ characters in "
    "$SYNCLANE_DASHBOARD_SECRET"
)

PROXY_HELP = "accept requests forwarded by a proxy (X-Forwarded-*); the proxy or the login guards"


def add_common(parser: argparse.ArgumentParser, default: object, *, title: str = "") -> None:
    """Options every command takes, before or after its name (listed under `title`)."""
    group = parser.add_argument_group(title) if title else parser
    group.add_argument(
        "--dsn", default=default, help="PostgreSQL DSN (default: $SYNCLANE_DSN, else embedded)"
    )
    group.add_argument(
        "--pooler",
        default=default,
        choices=["transaction"],
        help="the DSN goes through a transaction pooler (PgBouncer in transaction mode, a "
        "managed pooler): nothing prepared, no session state ($SYNCLANE_POOLER)",
    )
    group.add_argument(
        "--listen-dsn",
        default=default,
        help="with --pooler: a direct connection on which workers LISTEN for due work "
        "($SYNCLANE_LISTEN_DSN; without it they poll)",
    )
    group.add_argument(
        "--app", default=default, help="the app, package.module:attribute ($SYNCLANE_APP)"
    )
    group.add_argument(
        "--schema",
        default=default,
        help="the table's schema ($SYNCLANE_SCHEMA) for `demo`, `migrate` without an app, and "
        "apps that read it (the demo's does); an app with another schema is refused",
    )
    group.add_argument(
        "-v", "--verbose", action="count", default=default, help="details too (DEBUG)"
    )
    group.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="only problems (WARNING)"
    )
    group.add_argument(
        "--traceback", action="store_true", default=default, help="show where an error came from"
    )


def add_filters(parser: argparse.ArgumentParser, *, queue: str = "only this queue") -> None:
    """--queue, --owner and --type, which narrow what a command reads or changes."""
    parser.add_argument("--queue", type=name("--queue"), help=queue)
    parser.add_argument("--owner", type=name("--owner"), help="only this owner")
    parser.add_argument("--type", type=name("--type"), help="only this type")


# -- values of options: argparse puts "argument --x: " before each message ---------------------


def seconds(text: str, *, zero: bool = False, example: str = "30") -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    low_ok = value >= 0 if zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_DURATION.total_seconds()):
        bound = ">= 0" if zero else "> 0"
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds {bound} and at most 100 years, e.g. {example}"
        )
    return value


def grace(text: str) -> float:
    return seconds(text, zero=True, example="60 (0 stops as soon as nothing is due)")


def speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 100):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time factor > 0 and at most 100: 1 is the demo's own pace, 0.1 "
            "ten times faster"
        )
    return value


def days(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_DURATION.days):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of days > 0 and at most {MAX_DURATION.days} "
            "(100 years), e.g. 730"
        )
    return value


def whole(low: int, high: int, example: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number from {low} to {high:,}, e.g. {example}"
            )
        return value

    return parse


def cause_id(text: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{8}", text.strip().lower()):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cause id: the 8 hex digits `synclane failures` shows in its "
            "first column, e.g. 3f2a9c1b"
        )
    return text.strip().lower()


def reason(command: str) -> Callable[[str], str]:
    """--reason: the limit app.pause and app.cancel keep (check_reason)."""

    def parse(text: str) -> str:
        try:
            return check_reason(command, text, f"{command} --reason 'warehouse maintenance'")
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def name(what: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check_name(what, text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


# -- the app, and the names it knows --------------------------------------------------------


def connection_environment(args: argparse.Namespace) -> None:
    """--pooler and --listen-dsn reach every SyncLane the command builds (the app's, or its
    own), as $SYNCLANE_POOLER and $SYNCLANE_LISTEN_DSN do."""
    if getattr(args, "pooler", None):
        os.environ["SYNCLANE_POOLER"] = args.pooler
    if getattr(args, "listen_dsn", None):
        os.environ["SYNCLANE_LISTEN_DSN"] = args.listen_dsn


def load_app(args: argparse.Namespace) -> SyncLane:
    """The app named by --app or $SYNCLANE_APP. --dsn and --schema reach apps that read
    $SYNCLANE_DSN and $SYNCLANE_SCHEMA (SyncLane(None, ...) does the first, the demo's app both);
    an app whose schema is not the --schema given is refused."""
    path = args.app or os.environ.get("SYNCLANE_APP")
    if not path:
        raise UsageError(
            "no app: pass --app package.module:app or set SYNCLANE_APP "
            "(the demo's is synclane.demo.app:app)"
        )
    if args.schema:
        os.environ["SYNCLANE_SCHEMA"] = args.schema
    app = loading.load_app(path, args.dsn or None)
    if args.pooler and app.pooler != args.pooler:
        raise UsageError(
            f"argument --pooler: the app {path} was built with pooler={app.pooler!r}; drop "
            "--pooler, or build the app with pooler=None so that it reads $SYNCLANE_POOLER"
        )
    if args.schema and app.schema != args.schema:
        raise UsageError(
            f"argument --schema: the app {path} keeps its table in schema {app.schema!r}, not "
            f"{args.schema!r}; drop --schema (an app names its own schema) or build the app with "
            "schema=os.environ['SYNCLANE_SCHEMA']"
        )
    if not creating_allowed():
        check_table(app)
    return app


def check_table(app: SyncLane) -> None:
    """For a command that only reads or fixes rows: the app's schema must hold synclane's table
    (at this synclane's version); one line names `synclane migrate` where it does not."""
    with app.database.connection(check_schema=False) as conn:
        version = app.store.current_version(conn)
        conn.commit()
    if version is None:
        raise UsageError(
            f"schema {app.schema!r} has no synclane table (is --schema or the app's schema "
            f"mistyped?); nothing was created: `synclane --schema {app.schema} migrate` creates "
            "it"
        )
    app.database.check_schema()


def queues(app: SyncLane, queue: str | None, *, one: bool = False) -> list[str]:
    """The queues a command works on: --queue, else every queue (or the only one, where a
    command needs one)."""
    if queue is not None and queue not in app.queues:
        known = ", ".join(app.queues) or "none"
        raise UsageError(f"argument --queue: the app has no queue {queue!r} (it has: {known})")
    if queue is not None:
        return [queue]
    if one and len(app.queues) != 1:
        raise UsageError(f"argument --queue is needed: the app has {len(app.queues)} queues")
    return list(app.queues)


def check_type(app: SyncLane, queues: Sequence[str], job_type: str | None) -> None:
    if job_type is None or any(job_type in app.queues[q].types for q in queues):
        return
    known = sorted({t for q in queues for t in app.queues[q].types})
    where = queues[0] if len(queues) == 1 else ", ".join(queues)
    raise UsageError(
        f"argument --type: queue {where} has no type {job_type!r} (it has: "
        f"{', '.join(known) or 'none'})"
    )


def check_owner(app: SyncLane, queues: Sequence[str], owner: str | None) -> None:
    """An owner is known when a queue has a job of it or its owner source lists it. Asked only
    when a command found nothing, to tell a typo from an owner with nothing to show."""
    if owner is None:
        return
    for queue in queues:
        if not app.jobs(queue, owner=owner, limit=1).empty:
            return
        if app.queues[queue].owner_source is not None:
            try:
                if any(o.id == owner for o in app.connected_owners(queue)):
                    return
            except OwnerSourceError:
                pass
    raise UsageError(
        f"argument --owner: no job of {owner!r} in queue {', '.join(queues)}, and the owner "
        "source does not list it"
    )


def check_connected(app: SyncLane, queue: str, owner: str) -> None:
    """Planning one owner plans an owner the queue's owner source lists now."""
    if not any(o.id == owner for o in app.connected_owners(queue)):
        raise UsageError(
            f"argument --owner: the owner source of queue {queue} does not list {owner!r}, so "
            "there is nothing to plan for it"
        )


def filters(**named: str | None) -> str:
    """' (owner acme-us, type orders)' for the filters given, '' for none."""
    given = [f"{name} {value}" for name, value in named.items() if value]
    return f" ({', '.join(given)})" if given else ""


# -- commands printed for the reader to run -------------------------------------------------


def program() -> str:
    """How another terminal runs this synclane: `synclane` where that name on its PATH is this
    very program; else this program's path (a virtualenv's bin folder is rarely on the PATH of
    a new terminal); else this Python with `-m synclane.cli`."""
    script = Path(sys.argv[0])
    if script.name != "synclane":  # `python -m synclane.cli`
        script = Path(sys.executable).parent / "synclane"  # the script of this environment
        if not script.is_file():
            return f"{_shell_path(Path(sys.executable))} -m synclane.cli"
    found = shutil.which("synclane")
    if found is not None and os.path.samefile(found, script):
        return "synclane"
    return _shell_path(script.absolute())


def _shell_path(path: Path) -> str:
    """A path a shell reads as it is: `~/…` under the home folder (shorter), quoted if need be."""
    text = str(path)
    home = str(Path.home())
    if text.startswith(home + os.sep) and shlex.quote(text) == text:
        return "~" + text[len(home) :]
    return shlex.quote(text)


def rerun(app: SyncLane, app_path: str, *, dsn_option: bool) -> tuple[str, str]:
    """The start of a command that reaches this app's table from another terminal, and what it
    needs there that cannot be printed (a password), '' when nothing: the program, the
    database (a DSN without a password as --dsn; the embedded one's folder when it was chosen
    by $SYNCLANE_DATA_DIR), the schema when it is not the default, and --app. `dsn_option`:
    whether the DSN came from --dsn (else from $SYNCLANE_DSN)."""
    words = [program()]
    needs = ""
    if app.embedded:
        folder = os.environ.get("SYNCLANE_DATA_DIR")
        if folder:
            words.insert(0, f"SYNCLANE_DATA_DIR={_shell_path(Path(folder).absolute())}")
    elif redact(app.dsn) == app.dsn:
        words += ["--dsn", shlex.quote(app.dsn)]
    else:
        given = "the same --dsn" if dsn_option else "SYNCLANE_DSN set as here"
        needs = f" (with {given}: the DSN holds a password)"
    if app.schema != "synclane":
        words += ["--schema", shlex.quote(app.schema)]
    words += ["--app", app_path]
    return " ".join(words), needs
