"""The `jobqueue` command line: submit, get, wait, list, retry, cancel (one job or by filter),
queues, pause and resume against JOBQUEUE_URL (default http://localhost:8080) with
JOBQUEUE_TOKEN, through `Client`; and
`migrate`, which upgrades the database at DATABASE_URL (`jobcore.migrate`, imported only
for it, so the client stays light).

Tables for people (`render`, which brings rich in), one JSON document on stdout with
`--json`. Exit status: 0 success; 1 not found, conflict, a wait that did not end
`completed`, or an API that cannot be reached or refuses the token; 2 a usage error
(arguments, a payload that is not JSON, a duration that is not one, input the API refuses).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from itertools import islice
from typing import Any

from jobcore.client.errors import ClientError, Invalid, WaitTimeout
from jobcore.client.records import Job, QueueDepth
from jobcore.client.sync import Client
from jobcore.durations import parse_duration
from jobcore.errors import JobqueueError
from jobcore.states import Status

OK, FAILED, USAGE = 0, 1, 2
MAX_PAGE = 500  # the API's largest page


class Usage(JobqueueError):
    """A usage error found after parsing (a payload that is not JSON, a URL that is not one)."""


def _duration(text: str) -> str:
    """A duration as the API takes it (checked here, sent as written)."""
    try:
        parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _seconds(text: str) -> float:
    return parse_duration(_duration(text))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _common() -> argparse.ArgumentParser:
    """--url, --token and --json, taken before or after the command (SUPPRESS: a subcommand
    that is not given one leaves the main parser's value alone)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="the API (default: $JOBQUEUE_URL, else http://localhost:8080)",
    )
    common.add_argument(
        "--token", default=argparse.SUPPRESS, help="bearer token (default: $JOBQUEUE_TOKEN)"
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print one JSON document on stdout instead of a table",
    )
    return common


def parser() -> argparse.ArgumentParser:
    common = _common()
    main = argparse.ArgumentParser(
        prog="jobqueue",
        description="Submit and inspect jobqueue jobs through its HTTP API.",
        parents=[common],
        epilog="Exit status: 0 success, 1 not found / conflict / failed wait / API "
        "unreachable, 2 usage error.",
    )
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help, parents=[common])

    submit = command("submit", "submit a job; print its record")
    submit.add_argument("type", metavar="TYPE", help="a job type the API knows")
    submit.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="the payload as JSON ('-': stdin)"
    )
    submit.add_argument("--queue", help="the queue (default: default)")
    submit.add_argument("--priority", type=int, help="-100..100, higher runs first")
    submit.add_argument(
        "--concurrency-key", help="its key: jobs of one key share KEY_CONCURRENCY, take turns"
    )
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_duration, help="due after this duration (90s, 1m30s)")
    when.add_argument("--run-at", help="due at this RFC 3339 time (2026-12-01T09:30:00Z)")
    submit.add_argument("--timeout", type=_duration, help="this job's limit per attempt")
    submit.add_argument("--max-attempts", type=int, help="1..100")
    submit.add_argument("--idempotency-key", help="submitting again with it is a replay")
    submit.add_argument(
        "--wait", action="store_true", help="then wait until it has finished (as `wait`)"
    )
    submit.add_argument(
        "--wait-timeout", type=_seconds, metavar="DURATION", help="give up waiting after this"
    )

    command("get", "print a job's record").add_argument("id", metavar="ID")

    wait = command("wait", "wait until a job has finished; exit 0 only if it completed")
    wait.add_argument("id", metavar="ID")
    wait.add_argument(
        "--timeout", type=_seconds, metavar="DURATION", help="give up after this (default: never)"
    )

    listing = command("list", "list jobs, newest first")
    listing.add_argument("--status", help="a status or several: failed,dead_letter")
    listing.add_argument("--type", help="a job type")
    listing.add_argument("--queue", help="a queue")
    listing.add_argument(
        "--limit", type=_positive, default=50, help="at most this many jobs (default: 50)"
    )

    for name, help in (
        ("retry", "requeue a dead_letter, failed or cancelled job, or those a filter matches"),
        ("cancel", "cancel a job, or those a filter matches (running ones: by their worker)"),
    ):
        act = command(name, help)
        act.add_argument("id", metavar="ID", nargs="?", help="one job (or give a filter)")
        act.add_argument("--status", help="a status or several: failed,dead_letter")
        act.add_argument("--type", help="a job type")
        act.add_argument("--queue", help="a queue")
        act.add_argument(
            "--limit", type=_positive, help="at most this many jobs (1..10000, default 1000)"
        )
    command("queues", "each queue's pending, scheduled, processing and dead-letter jobs")
    command("pause", "pause a queue: no worker claims from it").add_argument(
        "queue", metavar="QUEUE"
    )
    command("resume", "resume a paused queue").add_argument("queue", metavar="QUEUE")

    migrate = commands.add_parser(
        "migrate",
        help="upgrade the database at $DATABASE_URL to this version's schema",
        description="Upgrade the database at $DATABASE_URL (schema $DATABASE_SCHEMA, default "
        "jobqueue) to this version's head. Exit status: 0 done (or, with --check, at head), "
        "1 behind (--check) or failed, 2 invalid configuration.",
    )
    what = migrate.add_mutually_exclusive_group()
    what.add_argument(
        "--check", action="store_true", help="only report: exit 0 at head, 1 when behind"
    )
    what.add_argument("--sql", action="store_true", help="print the SQL instead of running it")
    migrate.add_argument(
        "--from",
        dest="start",
        metavar="REVISION",
        help="with --sql: the revision the SQL starts from (default: the database's)",
    )
    return main


class Output:
    """Where results go: JSON documents, or tables (rich, imported only for these)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def job(self, job: Job, note: str | None = None) -> None:
        if self.as_json:
            _print_json(dict(job.raw))
        else:
            from jobcore.client import render

            render.job(job, note)

    def jobs(self, jobs: list[Job], more: bool) -> None:
        if self.as_json:
            _print_json([dict(job.raw) for job in jobs])
        else:
            from jobcore.client import render

            render.jobs(jobs, more)

    def queues(self, depths: list[QueueDepth]) -> None:
        if self.as_json:
            _print_json([dict(depth.raw) for depth in depths])
        else:
            from jobcore.client import render

            render.queues(depths)


def _print_json(document: Any) -> None:
    sys.stdout.write(json.dumps(document) + "\n")


def _payload(text: str | None) -> Any:
    if text is None:
        return None
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Usage(f"PAYLOAD_JSON is not valid JSON: {exc}") from None


def _wait(client: Client, job_id: str, timeout: float | None, out: Output) -> int:
    """Wait for the job, with a status line on a terminal; 0 only if it completed."""
    status = None
    if not out.as_json and sys.stderr.isatty():
        from jobcore.client import render

        status = render.progress(job_id)
    try:
        job = client.wait(job_id, timeout, progress=status.update if status else None)
    except WaitTimeout as exc:
        if status is not None:
            status.stop()
            status = None
        out.job(exc.job)
        _error(str(exc))
        return FAILED
    finally:
        if status is not None:
            status.stop()
    out.job(job)
    return OK if job.status is Status.COMPLETED else FAILED


def _error(message: str) -> None:
    sys.stderr.write(f"jobqueue: {message}\n")


def run(args: argparse.Namespace) -> int:
    out = Output(getattr(args, "json", False))
    try:
        client = Client(getattr(args, "url", None), getattr(args, "token", None))
    except ValueError as exc:
        raise Usage(str(exc)) from None
    with client:
        if args.command == "submit":
            if args.wait_timeout is not None and not args.wait:
                raise Usage("--wait-timeout goes with --wait")
            fields = {
                name: value
                for name, value in {
                    "queue": args.queue,
                    "priority": args.priority,
                    "concurrency_key": args.concurrency_key,
                    "delay": args.delay,
                    "run_at": args.run_at,
                    "timeout": args.timeout,
                    "max_attempts": args.max_attempts,
                }.items()
                if value is not None
            }
            job = client.submit(
                args.type,
                _payload(args.payload),
                idempotency_key=args.idempotency_key,
                **fields,
            )
            if args.wait:
                return _wait(client, job.id, args.wait_timeout, out)
            out.job(job)
        elif args.command == "get":
            out.job(client.get(args.id))
        elif args.command == "wait":
            return _wait(client, args.id, args.timeout, out)
        elif args.command == "list":
            page = min(args.limit + 1, MAX_PAGE)
            found = client.list(args.status, args.type, args.queue, page_size=page)
            jobs = list(islice(found, args.limit + 1))
            out.jobs(jobs[: args.limit], more=len(jobs) > args.limit)
        elif args.command in ("retry", "cancel") and _filtered(args):
            return _act_on_matching(client, args, out)
        elif args.command == "retry":
            out.job(client.retry(args.id))
        elif args.command == "cancel":
            job = client.cancel(args.id)
            note = None
            if job.status is Status.PROCESSING:
                note = "cancel requested: the worker running it stops it within a second"
            out.job(job, note)
        elif args.command == "queues":
            out.queues(client.queues())
        elif args.command in ("pause", "resume"):
            paused = (
                client.pause(args.queue) if args.command == "pause" else client.resume(args.queue)
            )
            if out.as_json:
                _print_json({"queue": args.queue, "paused": paused})
            else:
                sys.stdout.write(f"{args.queue}: {'paused' if paused else 'resumed'}\n")
    return OK


def _filtered(args: argparse.Namespace) -> bool:
    """Whether `retry`/`cancel` acts on a filter (else on the job ID); a usage error for
    both or neither."""
    given = [args.status, args.type, args.queue]
    if args.id is not None:
        if any(value is not None for value in given) or args.limit is not None:
            raise Usage("give a job ID or a filter (--status, --type, --queue), not both")
        return False
    if all(value is None for value in given):
        raise Usage("give a job ID or a filter (--status, --type, --queue)")
    return True


def _act_on_matching(client: Client, args: argparse.Namespace, out: Output) -> int:
    """`cancel`/`retry` by filter: print the counts."""
    fields = {"status": args.status, "type": args.type, "queue": args.queue, "limit": args.limit}
    if args.command == "cancel":
        done = client.cancel_matching(**fields)
        line = f"cancelled {done['cancelled']}, cancel requested {done['cancel_requested']}"
    else:
        done = client.retry_matching(**fields)
        line = f"retried {done['retried']}"
    if out.as_json:
        _print_json(done)
    else:
        more = "; more match: run it again" if done["more"] else ""
        sys.stdout.write(line + more + "\n")
    return OK


def _migrate(args: argparse.Namespace) -> int:
    """`jobqueue migrate`: one line on stdout saying where the database is."""
    from jobcore.extras import require

    require("server", "jobqueue migrate")  # Alembic and the driver: exit 2 naming the extra
    from jobcore import migrate
    from jobcore.errors import ConfigError

    try:
        if args.start is not None and not args.sql:
            raise Usage("--from goes with --sql")
        if args.check:
            found = migrate.state()
            if found.at_head:
                sys.stdout.write(f"at head: {found.head}\n")
                return OK
            sys.stdout.write(f"behind: current {found.current or 'none'}, wanted {found.head}\n")
            return FAILED
        if args.sql:
            sys.stdout.write(migrate.sql(start=args.start))
            return OK
        done = migrate.upgrade()
    except ConfigError as exc:
        _error(f"migrate: invalid configuration: {exc}")
        return USAGE
    except migrate.MigrationError as exc:
        _error(f"migrate: {exc}")
        return FAILED
    if done.deferred:
        sys.stdout.write(
            f"at {done.after}: the compatibility views stay for {done.deferred} sessions of "
            "the previous release; run `jobqueue migrate` again once they are gone\n"
        )
    elif done.before == done.after:
        sys.stdout.write(f"already at head: {done.after}\n")
    else:
        sys.stdout.write(f"upgraded from {done.before or 'none'} to {done.after}\n")
    return OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "migrate":
        try:
            return _migrate(args)
        except Usage as exc:
            _error(f"migrate: {exc}")
            return USAGE
    try:
        return run(args)
    except (Usage, Invalid) as exc:
        _error(f"{args.command}: {exc}")
        return USAGE
    except ClientError as exc:
        _error(f"{args.command}: {exc}")
        return FAILED
    except KeyboardInterrupt:
        return 130
