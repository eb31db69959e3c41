"""A job's code before a command starts its next attempt (resume, failover, launch): packed and
uploaded once (cli/code), and what the change then records of it (docs/guides/code.md)."""

from __future__ import annotations

from dataclasses import replace


def prepare(ref, cfg, job_id: str, bucket: str | None = None, session=None, applier=None, keep: bool = False,
            bucket_option: bool = True, repin: bool = False):
    """The job's ``CodeRef`` for its next attempt (None: no ``code:``, or ``keep``: the recorded code
    runs). The bucket is looked for (``known_bucket``) only when an archive must be uploaded;
    ``bucket_option``: the command has --events-bucket (its hint names only what it has); ``repin``
    (--update-code): a git job's ref is resolved again instead of running the recorded commit.

    Raises:
        typer.Exit: through ``fail``: one error naming the job and key (cli.code.CodeError).
    """
    from cli.commands import cloud_for, fail

    if keep and repin:
        raise fail("give --keep-code or --update-code, not both")
    job = cfg.job(job_id)
    if job.code is None or keep:
        return None
    from cli.code import CodeError
    from cli.code.prepare import StackContext, prepare_code
    from cli.commands.hints import bucket_hint, known_bucket
    from cli.lifecycle.stackfile import project_root

    ctx = StackContext(ref.name, project_root(ref.path.parent), bucket=bucket, store=cloud_for(cfg, ref),
                       locate=lambda: known_bucket(ref, session, applier)[0])
    try:
        return prepare_code(job, ctx, repin=repin)
    except CodeError as exc:
        hint = f" ({bucket_hint(ref, bucket_option)})" if "event bucket" in str(exc) and not bucket else ""
        raise fail(f"{exc}{hint}") from None


def with_code(decide, code):
    """``decide`` whose new attempt (a change setting ``attempt``) also records ``code`` when the job
    entry records other code: a changed digest reaches only a new attempt, and shows in its preview."""
    if code is None:
        return decide

    def decided(job):
        change = decide(job)
        if change.noop or "attempt" not in change.fields or not code.changes(job):
            return change
        was = (job.code_digest or job.code_commit or "none")[:12]
        now = (code.digest or code.commit)[:12]
        return replace(change, fields={**change.fields, **code.fields()}, reason=f"{change.reason}; code {was} -> {now}")

    return decided
