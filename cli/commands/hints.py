"""What a command suggests when it lacks the stack's event bucket: only options it has, so a hint never
names another command's option (README "Everyday use of the command line")."""


def bucket_hint(ref, bucket_option: bool = True) -> str:
    """How to name the stack's event bucket, in options the command has (``bucket_option``: --events-bucket)."""
    sync = f"`spotctl sync --stack {ref.name} --events-bucket NAME` once (the stack's eventBucket output)"
    return f"give --events-bucket NAME (the stack's eventBucket output), or run {sync}" if bucket_option else f"run {sync}"
