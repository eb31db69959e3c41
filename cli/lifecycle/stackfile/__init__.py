"""Finding, reading and safely rewriting ``stacks/Pulumi.<stack>.yaml``.

Edits are round-trips through ruamel.yaml (comments, key order and ``secure:`` values untouched),
validated before anything is written, and written atomically (temp file + rename) under a file
lock, so a crash or a concurrent spotctl leaves either the old or the new valid file.

The rooms, lowest first (each imports only those before it): ``refs`` (which file a stack is),
``reading`` (bounded reads, parse caches, digests), ``writing`` (atomic durable writes, line ends kept),
``shared`` (the shared copy's sessions), ``splicing`` (a job's lines in a text), ``proposal`` (the
record of an edit awaiting its answer), ``locking``, ``jobindex`` and ``parts`` (one job read and
written without the whole file), ``commit`` (write, then push), ``loading``, ``editing`` and
``proposals`` (proposing, undoing). Every name stays importable from here.
"""

import os  # noqa: F401  (tests patch ``stackfile.os``)

from cli.lifecycle.stackfile.commit import (  # noqa: F401
    _commit,
    _synced,
    publish,
    pull_shared,
)
from cli.lifecycle.stackfile.editing import (  # noqa: F401
    _edit,
    _put_back_job,
    _take_job,
    _update_job,
    edit,
    job_fields,
    put_back_job,
    retire,
    take_job,
    update_job,
)
from cli.lifecycle.stackfile.jobindex import (  # noqa: F401
    _RULES,
    _WORD,
    CACHE_LIMIT,
    INDEX_VERSION,
    _guard,
    _guards,
    _Index,
    _index,
    _job_spans,
    _plain_written,
    _read_index,
    _rules,
    _stored_index,
    _write_index,
    code_fingerprint,
    job_digests,
    write_cache,
)
from cli.lifecycle.stackfile.loading import (  # noqa: F401
    load,
    load_job,
)
from cli.lifecycle.stackfile.locking import (  # noqa: F401
    LOCK_TIMEOUT_S,
    _held,
    locked,
)
from cli.lifecycle.stackfile.parts import (  # noqa: F401
    _LAST_PART,
    _job_part,
    _Part,
    _part_of,
    _read_part,
    _rewrite,
    _splice_part,
    _stamped_part,
)
from cli.lifecycle.stackfile.proposal import (  # noqa: F401
    _local_only,
    _proposal,
    _proposer_alive,
    held_back,
    note_proposal,
    pid_alive,
    process_started,
    proposed_job,
    write_proposal,
)
from cli.lifecycle.stackfile.proposals import (  # noqa: F401
    _drop_dead_proposal,
    proposing,
    restore_fields,
)
from cli.lifecycle.stackfile.reading import (  # noqa: F401
    _FAST_LOADER,
    _LAST_DIGEST,
    _LAST_READ,
    _LAST_WRITTEN,
    _PARSED,
    _PARSED_LOCK,
    _PARSED_MAX,
    BOM,
    MAX_DEPTH,
    MAX_NODES,
    _check_document,
    _check_shape,
    _digest,
    _fast_load,
    _fast_loader,
    _file_state,
    _load_document,
    _parse,
    _Parsed,
    _parsed,
    _read_state,
    _read_text,
    _remember,
    _yaml,
    _yaml_error,
    decode,
    namespaced,
    plain,
    provider_conflicts,
    read_config,
    read_text,
    sha256,
    validate,
)
from cli.lifecycle.stackfile.refs import (  # noqa: F401
    STACK_FILE_RE,
    STACK_NAME_RE,
    StackRef,
    beside,
    index_path,
    lock_path,
    project_root,
    proposal_path,
    resolve,
    sync_record_path,
)
from cli.lifecycle.stackfile.shared import (  # noqa: F401
    _SHARED,
    SYNC_TRIES,
    SharedCopyMoved,
    SharedCopyUnreachable,
    _shared_name,
    sharing,
)
from cli.lifecycle.stackfile.splicing import (  # noqa: F401
    MISSING,
    _entry_lines,
    _jobs_in,
    _jobs_node,
    _last_line,
    _scalar_text,
    _set_fields,
    _splice_job_fields,
    job_entry,
    key,
    remove_job,
    set_job_fields,
)
from cli.lifecycle.stackfile.writing import (  # noqa: F401
    CHANGED_MEANWHILE,
    _Changed,
    _copy,
    _increasing,
    _keep_line_ends,
    _kept_lines,
    _line_ends,
    _stamped_state,
    _still,
    _sync_folder,
    _write_all,
    atomic_write,
    open_regular,
    refuse_linked_folder,
    write_stack,
)
