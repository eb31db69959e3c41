"""A job's code on its way to the VM: which files (``files``), the deterministic archive
(``archive``), a git ref pinned to a commit (``gitref``), and the upload of one job's archive
to the stack's bucket (``prepare``). docs/guides/code.md tells users what this does."""


class CodeError(Exception):
    """A job's code cannot be packed, resolved or uploaded: one message naming the job and key."""
