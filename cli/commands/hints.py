"""Where a command finds the stack's event bucket when neither --events-bucket nor --events-dir is
given, and what it suggests when it finds none: only options it has, so a hint never names another
command's option (README "Everyday use of the command line")."""

from __future__ import annotations


def bucket_hint(ref, bucket_option: bool = True) -> str:
    """How to name the stack's event bucket, in options the command has (``bucket_option``: --events-bucket)."""
    return f"give --events-bucket NAME (the stack's eventBucket output), or {sync_hint(ref)}" if bucket_option else sync_hint(ref)


def sync_hint(ref) -> str:
    """How to make this machine know the stack's event bucket for good."""
    return f"run `spotctl sync --stack {ref.name} --events-bucket NAME` once (the stack's eventBucket output)"


def known_bucket(ref, session=None, applier=None) -> tuple[str | None, str]:
    """The stack's event bucket as this machine knows it without being told, and where from: the sync
    session's (``session``: --events-bucket, the synced one, or the eventBucket output), else the one this
    stack file was last synced with (a record sealed with this user's key: a commit cannot name another
    bucket), else the stack's eventBucket output, asked only of an ``applier`` (a command that talks to
    Pulumi anyway). (None, "") when none is known or Pulumi cannot say."""
    from cli.lifecycle.stackfile import sync_record_path

    synced = sync_record_path(ref.path).exists()  # (without importing the sync part otherwise)
    sealed = (session is not None or synced) and _sealed_records()  # (no key: the bucket may be an unsealed record's)
    if session is not None and sealed:
        return session.bucket, f"bucket {session.bucket} (the stack file's shared copy's)"
    if sealed and synced:
        from cli.lifecycle.sync import read_record

        record = read_record(ref.path)
        if record is not None:
            return record.bucket, f"bucket {record.bucket} (the one this stack file was synced with)"
    if applier is not None:
        from cli.lifecycle.apply import ApplyError

        try:
            bucket = applier.outputs().get("eventBucket")
        except ApplyError:
            return None, ""
        if bucket:
            return str(bucket), f"bucket {bucket} (the stack's eventBucket output)"
    return None, ""


def _sealed_records() -> bool:
    """Whether this user's key seals records: without one, a record is read unsealed (a commit could
    carry one naming another bucket), which may say where to push but never where events are read."""
    from cli.lifecycle import cachefile

    return cachefile.key() is not None


class Unread(Exception):
    """A bucket this machine knew of (not given on the command line) could not be read."""


def source_place(events_dir, bucket) -> str:
    """The events source in a person's words: the folder, or "bucket NAME"."""
    return str(events_dir) if events_dir is not None else f"bucket {bucket}"


def events_source(ref, cfg, events_dir, bucket, session=None, applier=None) -> tuple[str | None, str]:
    """(the bucket to read the jobs' events from, where it was found: "" when given or none). Given
    --events-bucket or --events-dir, exactly what was given; else the bucket ``known_bucket`` knows."""
    if bucket or events_dir is not None or cfg is None:  # (cfg None: a file never synced, read for status)
        return bucket, ""
    return known_bucket(ref, session, applier)
