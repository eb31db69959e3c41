"""The job index: an edit of one job of a file spotctl validated whole reads, validates and
splices only that job's lines, and gives exactly the file (and errors) the whole-file path gives; a
stale, damaged or forged index, or a file it does not handle, only means the whole file is read."""

from __future__ import annotations

import difflib
import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import infra.config
from cli.lifecycle import cachefile, pipeline, stackfile
from cli.lifecycle.states import decide_resume
from infra.config import ConfigError

STACK = "example-gcp"


@pytest.fixture
def ref(project: Path) -> stackfile.StackRef:
    return stackfile.StackRef(STACK, project / "stacks" / f"Pulumi.{STACK}.yaml")


@pytest.fixture
def validated(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many jobs each validation saw."""
    seen: list[int] = []
    real = infra.config.validate

    def counting(raw, source):
        seen.append(len(raw.get("jobs") or []))
        return real(raw, source)

    monkeypatch.setattr(stackfile.reading, "validate", counting)
    return seen


def set_fields(ref: stackfile.StackRef, job: str, fields: dict) -> tuple:
    return stackfile.update_job(ref.path, job, lambda current, written: fields)


def whole_file_result(ref: stackfile.StackRef, job: str, fields: dict) -> bytes:
    """The file the whole-file path writes for this edit (no index)."""
    stackfile.index_path(ref.path).unlink(missing_ok=True)
    set_fields(ref, job, fields)
    return ref.path.read_bytes()


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("fields", [{"state": "preempted"}, {"attempt": 7, "capacity": "on-demand"},
                                    {"state": "preempted", "deadlineHours": 12}])
def test_an_indexed_edit_validates_only_the_job_and_writes_what_the_whole_file_path_writes(ref, validated, crlf, fields):
    if crlf:
        ref.path.write_bytes(ref.path.read_bytes().replace(b"\n", b"\r\n"))
    original = ref.path.read_bytes()
    expected = whole_file_result(ref, "vit-finetune", fields)
    ref.path.write_bytes(original)
    stackfile.load(stackfile.StackRef(STACK, ref.path))  # validated whole: indexed
    stackfile._PARSED.clear()  # as in a new process
    validated.clear()
    before, after = set_fields(ref, "vit-finetune", fields)
    assert ref.path.read_bytes() == expected
    assert validated and set(validated) == {1}  # never the whole file
    assert [j.id for j in after.jobs] == ["vit-finetune"] and after.job("vit-finetune").state.value == fields.get("state", "running")
    # the index follows the edit: the next edit of another job is indexed too, and the file stays valid
    for job in ("llm-pretrain", "bert-eval"):  # before and after the job whose length changed
        validated.clear()
        set_fields(ref, job, {"state": "preempted"})
        assert set(validated) == {1}, job
    assert stackfile.load(ref).job("llm-pretrain").state.value == "preempted"
    assert stackfile.load(ref).job("bert-eval").state.value == "preempted"
    assert "# Single A100 run that was preempted twice" in ref.path.read_text()


def test_load_job_reads_one_job_once_indexed_and_the_whole_file_otherwise(ref, validated):
    stackfile.index_path(ref.path).unlink(missing_ok=True)  # (one left in stacks/ by another run)
    assert [j.id for j in stackfile.load_job(ref, "bert-eval").jobs] == ["llm-pretrain", "vit-finetune", "bert-eval"]
    stackfile._PARSED.clear()  # another process: only the index on disk is shared
    assert [j.id for j in stackfile.load_job(ref, "bert-eval").jobs] == ["bert-eval"]
    with pytest.raises(KeyError, match="did you mean 'bert-eval'"):
        stackfile.load_job(ref, "bert-evl").job("bert-evl")


def new_process() -> None:
    """Empty the stack file module's in-process caches: what follows runs as in a new process."""
    for cache in (stackfile._PARSED, stackfile._LAST_DIGEST, stackfile._LAST_PART,
                  stackfile._LAST_READ, stackfile._LAST_WRITTEN):
        cache.clear()


def test_a_file_spotctl_wrote_is_never_hashed_whole_by_one_jobs_edit(ref, monkeypatch):
    """An index built from a file spotctl read is guarded by the sha256 of its text (hashed once,
    from the bytes read); once spotctl has written the file, by its stamped state: later edits of one
    job, in this process or a new one, hash nothing whole, and the index is rewritten, never re-derived."""
    stackfile.load(ref)
    new_process()
    real, whole, hashed = stackfile.sha256, len(ref.path.read_bytes()), []

    def counting(data):
        if len(data) > whole - 200:
            hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(stackfile.reading, "sha256", counting)
    monkeypatch.setattr(stackfile.jobindex, "_index", lambda *a: (_ for _ in ()).throw(AssertionError("indexed whole")))
    assert [j.id for j in stackfile.load_job(ref, "bert-eval").jobs] == ["bert-eval"]
    assert len(hashed) == 1  # the file as the user left it: its content
    set_fields(ref, "bert-eval", {"state": "preempted", "attempt": 12})
    assert len(hashed) == 1  # read again under the lock: the same text; the new file: its state
    set_fields(ref, "llm-pretrain", {"state": "preempted"})
    new_process()
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert [j.id for j in stackfile.load_job(ref, "vit-finetune").jobs] == ["vit-finetune"]
    assert len(hashed) == 1
    monkeypatch.undo()
    cfg = stackfile.load(ref)
    assert (cfg.job("bert-eval").attempt, cfg.job("llm-pretrain").state.value, cfg.job("vit-finetune").state.value) == \
        (12, "preempted", "preempted")


def test_a_same_size_edit_right_after_spotctls_write_is_seen(ref, validated):
    """A file spotctl wrote is guarded by its state: an in-place edit of the same size at once after the
    write (within the kernel's timestamp tick, the same inode) gets the tick's time, never spotctl's
    stamp, so the whole file is read (the edit made another job invalid) and nothing is written."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    text = ref.path.read_text()
    edited = text.replace("zone: us-central1-c", "zone: us-central9-c", 1)
    assert len(edited) == len(text) and edited != text
    before = os.stat(ref.path)
    with open(ref.path, "r+", encoding="utf-8") as fh:  # in place: the same inode and size
        fh.write(edited)
    after = os.stat(ref.path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    new_process()
    validated.clear()
    with pytest.raises(ConfigError, match=r"jobs\[2\]\.zone"):
        set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert validated == [3] and ref.path.read_text() == edited  # the whole file, and nothing written


def test_a_file_system_without_nanosecond_times_gets_the_hash(ref, monkeypatch):
    """Where the stamp does not read back as set (a file system keeping whole seconds), the state does
    not name a version: the index of the written file is guarded by its hash."""
    real = os.utime
    monkeypatch.setattr(stackfile.os, "utime", lambda fd, ns: real(fd, ns=tuple(t // 10**9 * 10**9 for t in ns)))
    set_fields(ref, "bert-eval", {"state": "preempted"})
    index = stackfile._Index.from_bytes(sealed_payload(stackfile.index_path(ref.path)))
    assert index.guard == stackfile.sha256(ref.path.read_bytes()).hexdigest()
    monkeypatch.undo()
    set_fields(ref, "llm-pretrain", {"state": "preempted"})
    index = stackfile._Index.from_bytes(sealed_payload(stackfile.index_path(ref.path)))
    st = os.stat(ref.path)
    assert index.guard == f"state:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def whole_reads_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, reading the stack file whole fails the test."""
    monkeypatch.setattr(stackfile.reading, "_read_text", lambda path: (_ for _ in ()).throw(AssertionError("read whole")))


@pytest.mark.parametrize("copy", ["in the kernel", "refused by the file system", "not on this platform"])
def test_a_file_spotctl_wrote_is_edited_in_pieces_as_the_whole_file_path_edits_it(ref, monkeypatch, copy):
    """Once spotctl wrote the file (its state guards the index, its bytes are its text), one job's
    read and edit read only the stack-wide lines and the job's (in a new process too), and the rest of the
    file is copied by the kernel (or through a small buffer where the file system cannot): the file is
    byte for byte what the whole-file path writes, and the index follows it."""
    stackfile.load(ref)
    set_fields(ref, "bert-eval", {"state": "preempted"})  # read whole (the user's file), written: stamped
    original = ref.path.read_bytes()
    edits = [("vit-finetune", {"state": "preempted", "attempt": 12}), ("llm-pretrain", {"capacity": "on-demand"}),
             ("bert-eval", {"state": "completed"})]
    for job, fields in edits:
        whole_file_result(ref, job, fields)
    expected = ref.path.read_bytes()
    ref.path.write_bytes(original)
    os.chmod(ref.path, 0o640)
    stackfile.index_path(ref.path).unlink()
    new_process()
    stackfile.load(ref)
    set_fields(ref, "bert-eval", {"state": "preempted"})  # (the same bytes again: stamped and indexed)
    assert ref.path.read_bytes() == original
    new_process()
    if copy == "refused by the file system":
        monkeypatch.setattr(stackfile.os, "copy_file_range",
                            lambda *a: (_ for _ in ()).throw(OSError(18, "Invalid cross-device link")), raising=False)
    elif copy == "not on this platform":  # (macOS, the BSDs)
        monkeypatch.delattr(stackfile.os, "copy_file_range", raising=False)
    with monkeypatch.context() as m:
        whole_reads_refused(m)
        assert [j.id for j in stackfile.load_job(ref, "vit-finetune").jobs] == ["vit-finetune"]
        for job, fields in edits:
            set_fields(ref, job, fields)
            new_process()
    assert ref.path.read_bytes() == expected
    assert os.stat(ref.path).st_mode & 0o777 == 0o640
    cfg = stackfile.load(ref)
    assert (cfg.job("vit-finetune").attempt, cfg.job("llm-pretrain").capacity.value, cfg.job("bert-eval").state.value) == \
        (12, "on-demand", "completed")


@pytest.mark.parametrize("when", ["deciding", "copying", "syncing"])
@pytest.mark.parametrize("how", ["in place", "saved over", "removed"])
def test_a_hand_edit_while_a_job_is_edited_in_pieces_is_kept_and_nothing_written(ref, monkeypatch, how, when):
    """Under the lock a hand edit (an editor saving, a checkout removing the file) can still land
    between the read of the job's lines and the rename: spotctl checks the file last, right before it,
    writes nothing (it would undo the hand edit, and it decided on what the edit replaced), and says to
    run it again."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    new_process()
    edited = ref.path.read_text().replace("# Finished", "# finished")

    def hand_edit():
        if how == "in place":
            with open(ref.path, "r+", encoding="utf-8") as fh:
                fh.write(edited)
        elif how == "saved over":
            other = ref.path.with_name("saved.tmp")
            other.write_text(edited)
            os.replace(other, ref.path)
        else:
            ref.path.unlink()

    def once(real):
        def run(*args):
            if not done:
                done.append(hand_edit())
            return real(*args)
        return run

    done: list = []
    if when == "copying":
        monkeypatch.setattr(stackfile.writing, "_copy", once(stackfile._copy))
    elif when == "syncing":
        monkeypatch.setattr(stackfile.os, "fsync", once(os.fsync))
    with pytest.raises(ConfigError, match="vit-finetune: the file changed while this command edited it"):
        stackfile.update_job(ref.path, "vit-finetune", lambda current, written: once(lambda: None)() or {"state": "preempted"}
                             if when == "deciding" else {"state": "preempted"})
    assert done
    assert (ref.path.read_text() == edited) if how != "removed" else not ref.path.exists()
    assert not list(ref.path.parent.glob(".*.tmp"))


@pytest.mark.parametrize("whole", ["not ASCII", "CRLF", "hand-edited", "a whole-file edit"])
@pytest.mark.parametrize("how", ["in place", "saved over", "removed"])
def test_a_hand_edit_during_a_whole_file_edit_is_kept_and_nothing_written(ref, monkeypatch, how, whole):
    """The whole-file path (a file that is not plain, the first edit after a hand edit, any ``edit``)
    also checks the file last, right before its rename: an editor's save during the write is kept."""
    text = ref.path.read_text()
    if whole == "not ASCII":
        ref.path.write_text(text.replace("# Finished", "# Finished (café)", 1))
    elif whole == "CRLF":
        ref.path.write_bytes(text.replace("\n", "\r\n").encode())
    else:  # (spotctl's own write first, then a hand edit: the next edit reads the file whole)
        set_fields(ref, "bert-eval", {"state": "preempted"})
        ref.path.write_text(ref.path.read_text().replace("# Finished", "# Finished by hand"))
    new_process()
    before = ref.path.read_bytes()
    edited = before.replace(b"# Finished", b"# finished")
    assert edited != before

    def hand_edit(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and not done:
            done.append(how)
            if how == "in place":
                with open(ref.path, "r+b") as fh:
                    fh.write(edited)
            elif how == "saved over":
                ref.path.with_name("saved.tmp").write_bytes(edited)
                os.replace(ref.path.with_name("saved.tmp"), ref.path)
            else:
                ref.path.unlink()
        return real(fd)

    done: list = []
    real = os.fsync
    monkeypatch.setattr(stackfile.os, "fsync", hand_edit)
    with pytest.raises(ConfigError, match="the file changed while this command edited it .*nothing was written"):
        if whole == "a whole-file edit":
            stackfile.edit(ref.path, lambda config, current: stackfile.set_job_fields(config, "vit-finetune", {"attempt": 9}))
        else:
            stackfile.update_job(ref.path, "vit-finetune", lambda current, written: {"state": "preempted"})
    assert done
    assert (ref.path.read_bytes() == edited) if how != "removed" else not ref.path.exists()
    assert not list(ref.path.parent.glob(".*.tmp"))


class FakeSession:
    """A shared copy's session (cli.lifecycle.sync.Shared's face to the stack file module)."""

    def __init__(self, push):
        self.unpushed, self.pushes, self._push = False, 0, push

    def mark_unpushed(self, unpushed: bool = True) -> bool:
        was, self.unpushed = self.unpushed, unpushed
        return was

    def pull(self) -> None:
        pass

    def push(self) -> None:
        self.pushes += 1
        self._push()


@pytest.mark.parametrize("lost", ["unreachable", "moved"])
def test_a_save_made_while_an_edit_is_pushed_is_never_undone(ref, lost):
    """A push that fails puts the old text back, unless the file was saved meanwhile: that save is kept,
    the command says so, and nothing is left marked to push."""
    saved = ref.path.read_text().replace("# Finished", "# saved while pushing")

    def push():
        ref.path.with_name("saved.tmp").write_text(saved)
        os.replace(ref.path.with_name("saved.tmp"), ref.path)
        if lost == "moved":
            raise stackfile.SharedCopyMoved()
        raise stackfile.SharedCopyUnreachable("gs://b/k", ["cannot be written (offline)"])

    session = FakeSession(push)
    with stackfile.sharing(ref.path, session), pytest.raises(
            ConfigError, match="the file changed here while the edit was pushed .*left as saved, nothing was pushed"):
        stackfile.take_job(ref.path, "bert-eval")
    assert ref.path.read_text() == saved and session.unpushed is False


def test_a_write_refused_for_a_hand_edit_leaves_nothing_marked_to_push(ref, monkeypatch):
    """The mark that an edit awaits its push is set before the write; a write refused because the file
    was saved meanwhile clears it again (else the next lock would push the editor's file)."""
    saved = ref.path.read_text().replace("# Finished", "# saved while writing")
    real = os.fsync

    def save_during_the_write(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and ref.path.read_text() != saved:
            ref.path.write_text(saved)
        return real(fd)

    session = FakeSession(lambda: None)
    monkeypatch.setattr(stackfile.os, "fsync", save_during_the_write)
    with stackfile.sharing(ref.path, session), pytest.raises(ConfigError, match="the file changed while this command"):
        stackfile.take_job(ref.path, "bert-eval")
    assert ref.path.read_text() == saved and session.unpushed is False and session.pushes == 0


@pytest.mark.parametrize("job", ["llm-pretrain", "bert-eval"])  # (the first job; the last: nothing after it)
def test_a_full_disk_fails_an_edit_in_pieces_and_the_file_stays(ref, monkeypatch, job):
    """A write that comes out short is continued; one the disk refuses fails the command with the
    file as it was (never a file cut short after the job), and no temporary file is left."""
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    new_process()
    before = ref.path.read_bytes()
    real, calls = os.write, []

    def short_then_full(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(28, "No space left on device")
        return real(fd, bytes(data)[: max(1, len(data) // 2)])

    monkeypatch.setattr(stackfile.os, "write", short_then_full)
    monkeypatch.delattr(stackfile.os, "copy_file_range", raising=False)  # (every byte through os.write)
    with pytest.raises(ConfigError, match="cannot write: No space left on device; the file is as it was"):
        set_fields(ref, job, {"state": "stopped", "stopReason": "a reason long enough to need two writes"})
    assert ref.path.read_bytes() == before and not list(ref.path.parent.glob(".*.tmp"))
    monkeypatch.setattr(stackfile.os, "write", lambda fd, data: real(fd, bytes(data)[:7]))  # short, never refused
    set_fields(ref, job, {"state": "preempted"})
    new_process()
    assert stackfile.load(ref).job(job).state.value == "preempted"


def test_a_file_written_in_place_while_its_pieces_are_read_is_read_whole(ref, monkeypatch):
    """``load_job`` takes no lock: a hand edit landing between the reads of the pieces (one job's lines
    of one version, the stack-wide lines of another) is seen by the state after the reads, and the whole
    file, as it is now, is read instead."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    new_process()
    edited = ref.path.read_text().replace("attempt: 3", "attempt: 4", 1)  # vit-finetune's
    real, done = os.pread, []

    def read_then_edit(fd, n, offset):
        data = real(fd, n, offset)  # (the job's lines first: the old attempt)
        if not done:
            with open(ref.path, "r+", encoding="utf-8") as fh:  # in place, before the other pieces are read
                done.append(fh.write(edited))
        return data

    monkeypatch.setattr(stackfile.os, "pread", read_then_edit)
    assert stackfile.load_job(ref, "vit-finetune").job("vit-finetune").attempt == 4
    assert done


def test_an_old_file_shorter_than_its_state_said_is_never_written_short(ref, monkeypatch):
    """The new file must come out exactly as long as the old one less the job's old lines plus its new
    ones: a copy that came out short (the old file truncated under it) fails the command, file kept."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    new_process()
    before, real = ref.path.read_bytes(), stackfile._copy
    monkeypatch.setattr(stackfile.writing, "_copy", lambda src, dst, offset, count: real(src, dst, offset, count // 2))
    with pytest.raises(ConfigError, match="cannot write: the new file came out short; the file is as it was"):
        set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert ref.path.read_bytes() == before and not list(ref.path.parent.glob(".*.tmp"))


def test_a_file_with_a_lone_carriage_return_is_not_indexed(ref):
    """YAML counts a lone CR as a line break, the index's lines do not: such a file is never indexed (its
    spans would be a line off), so every command reads it whole."""
    ref.path.write_bytes(ref.path.read_bytes().replace(b"    # Finished", b"    #\r# Finished", 1))
    stackfile.load(ref)
    assert not stackfile.index_path(ref.path).exists()
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert not stackfile.index_path(ref.path).exists()
    assert stackfile.load(ref).job("vit-finetune").state.value == "preempted" and b"#\r# Finished" in ref.path.read_bytes()


def test_loading_the_whole_file_keeps_the_index_of_spotctls_write(ref, monkeypatch):
    """A whole load (the watcher's every cycle, `validate`) of a file spotctl wrote keeps its index as it
    is (state-guarded, plain): a hash guard there would send the next edit back to reading the file whole."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    new_process()
    stackfile.load(ref)
    new_process()
    whole_reads_refused(monkeypatch)
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    monkeypatch.undo()
    assert stackfile.load(ref).job("vit-finetune").state.value == "preempted"


def test_an_edit_in_pieces_whose_stamp_is_lost_leaves_no_index(ref, monkeypatch):
    """Where the stamp of the rewritten file does not read back (a file system keeping whole seconds),
    its state names no version: the index is not rewritten, so the next edit reads the file whole."""
    set_fields(ref, "bert-eval", {"state": "preempted"})
    new_process()
    real = os.utime
    monkeypatch.setattr(stackfile.os, "utime", lambda fd, ns: real(fd, ns=tuple(t // 10**9 * 10**9 for t in ns)))
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    monkeypatch.undo()
    new_process()
    read: list[Path] = []
    monkeypatch.setattr(stackfile.reading, "_read_text", lambda path, real=stackfile._read_text: read.append(path) or real(path))
    set_fields(ref, "llm-pretrain", {"state": "preempted"})
    assert read


def test_a_file_that_is_not_plain_is_read_whole(ref, validated):
    """Offsets into the text are the file's only when its bytes are its text: a job's line with a
    non-ASCII character (or CRLF line ends, a byte-order mark) makes spotctl read the file whole, and the
    edit is still of one job."""
    ref.path.write_text(ref.path.read_text().replace("# Two-node H100", "# Deux nœuds H100"), encoding="utf-8")
    set_fields(ref, "bert-eval", {"state": "preempted"})  # (read whole: the user's file; then spotctl's)
    new_process()
    read: list[Path] = []
    real = stackfile._read_text
    stackfile.reading._read_text = lambda path: read.append(path) or real(path)
    try:
        set_fields(ref, "vit-finetune", {"state": "preempted"})
    finally:
        stackfile.reading._read_text = real
    assert read and validated[-1:] == [1]
    stackfile.reading._read_text = real
    new_process()
    index = stackfile._Index.from_bytes(sealed_payload(stackfile.index_path(ref.path)))
    assert index.guard.startswith("state:") and not index.plain  # (spotctl's write, but not plain)
    pread = stackfile.os.pread
    stackfile.os.pread = lambda *a: (_ for _ in ()).throw(AssertionError("offsets of a file that is not plain"))
    try:
        assert stackfile._stamped_part(ref.path, "vit-finetune") is None
    finally:
        stackfile.os.pread = pread
    assert stackfile.load(ref).job("vit-finetune").state.value == "preempted"
    assert "# Deux nœuds H100" in ref.path.read_text(encoding="utf-8")


def test_a_text_validated_for_another_file_still_indexes_this_one(ref, tmp_path):
    twin = tmp_path / "twin" / ref.path.name
    twin.parent.mkdir()
    twin.write_bytes(ref.path.read_bytes())
    stackfile.load_job(stackfile.StackRef(ref.name, twin), "bert-eval")  # this text is now validated in-process
    stackfile.index_path(ref.path).unlink(missing_ok=True)
    stackfile.load_job(ref, "bert-eval")
    assert stackfile.index_path(ref.path).exists()
    stackfile._PARSED.clear()  # another process: only the index on disk is shared
    assert [j.id for j in stackfile.load_job(ref, "bert-eval").jobs] == ["bert-eval"]


def test_a_hand_edit_after_indexing_is_read_whole(ref):
    stackfile.load(ref)
    # a duplicate key in another job: the index's hash no longer matches, so it is seen
    ref.path.write_text(ref.path.read_text().replace("      state: completed\n", "      state: completed\n      state: running\n"))
    with pytest.raises(ConfigError, match="duplicate key 'state'"):
        set_fields(ref, "vit-finetune", {"state": "preempted"})
    with pytest.raises(ConfigError, match="duplicate key 'state'"):
        stackfile.load_job(ref, "vit-finetune")


def test_a_hand_edit_of_the_same_size_and_time_is_seen(ref, validated):
    """The guard is the whole text's CRC-32 and length, never size + mtime + inode: an edit in place within the
    file system's timestamp granularity (here: the mtime put back) is still seen, and the whole
    file is validated (the edit made another job invalid)."""
    import os

    stackfile.load(ref)
    before = os.stat(ref.path)
    text = ref.path.read_text()
    edited = text.replace("zone: us-central1-c", "zone: us-central9-c", 1)
    assert len(edited) == len(text) and edited != text
    with open(ref.path, "r+", encoding="utf-8") as fh:  # in place: the same inode and size
        fh.write(edited)
    os.utime(ref.path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(ref.path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    stackfile._PARSED.clear()  # as in a new process
    validated.clear()
    with pytest.raises(ConfigError, match=r"jobs\[2\]\.zone"):
        set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert validated == [3] and ref.path.read_text() == edited  # the whole file, and nothing written


def forged(index: bytes, change) -> bytes:
    """The index with ``change(segments)`` applied to its job segments (its guard still true)."""
    parsed = stackfile._Index.from_bytes(index)
    change(parsed.segments)
    return parsed.to_bytes()


def with_header(index: bytes, **keys) -> bytes:
    head, rest = index.split(b"\n", 1)
    return json.dumps({**json.loads(head), **keys}).encode() + b"\n" + rest


def sealed_payload(path: Path) -> bytes:
    data = cachefile.read(path, stackfile.CACHE_LIMIT)
    assert data is not None
    return data


@pytest.mark.parametrize("damage", [
    lambda index: b"not an index",
    lambda index: index[:-3],  # torn
    lambda index: index + b"\0",
    lambda index: forged(index, lambda s: s.__setitem__(0, s[0] + 3)),  # forged lines: every job 3 characters later
    lambda index: forged(index, lambda s: s.__setitem__(1, 10**6)),
    lambda index: forged(index, lambda s: s.__setitem__(3, 0)),  # an empty job
    lambda index: with_header(index, rules="another spotctl"),
    lambda index: with_header(index, jobs=2),
    lambda index: index.replace(b"vit-finetune", b"vit-finetunf"),
])
@pytest.mark.parametrize("sealed", [True, False])
def test_a_damaged_index_only_means_the_whole_file(ref, damage, sealed):
    """Damaged and sealed (as a bug of ours would write it) or as anyone without the key writes it."""
    original = ref.path.read_bytes()
    expected = whole_file_result(ref, "vit-finetune", {"state": "preempted"})
    ref.path.write_bytes(original)
    stackfile.load(ref)
    path = stackfile.index_path(ref.path)
    damaged = damage(sealed_payload(path))
    if sealed:
        cachefile.write(path, damaged)
    else:
        path.write_bytes(damaged)
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert ref.path.read_bytes() == expected


def test_an_invalid_result_names_the_jobs_place_in_the_whole_file(ref):
    stackfile.load(ref)
    before = ref.path.read_bytes()
    with pytest.raises(ConfigError, match=r"spotctl:jobs\[1\]\.zone: .*us-west1-a") as err:
        set_fields(ref, "vit-finetune", {"zone": "us-west1-a"})
    assert "jobs[0]" not in str(err.value)
    assert ref.path.read_bytes() == before


def test_files_with_anchors_are_not_indexed(ref):
    text = ref.path.read_text().replace("      zone: us-central1-b\n", "      zone: &z us-central1-b\n", 1)
    ref.path.write_text(text)
    stackfile.index_path(ref.path).unlink(missing_ok=True)
    stackfile.load(ref)
    assert not stackfile.index_path(ref.path).exists()


def test_a_resume_of_an_indexed_stack_of_many_jobs_keeps_every_other_job(ref):
    head, jobs = ref.path.read_text().split("  spotctl:jobs:\n")
    many = "".join(f"    # job {i}\n    - id: job-{i}\n      machineType: g2-standard-8\n      accelerator: {{type: nvidia-l4, count: 1}}\n"
                   f"      diskGb: 100\n      zone: us-central1-a\n      capacity: spot\n      attempt: 2\n      state: preempted\n"
                   f"      command: python train.py\n" for i in range(50))
    ref.path.write_text(head + "  spotctl:jobs:\n" + many)
    stackfile.load(ref)
    pipeline.change_job(ref, "job-17", lambda j: decide_resume(j, []), applier=None)
    pipeline.change_job(ref, "job-49", lambda j: decide_resume(j, []), applier=None)
    cfg = stackfile.load(ref)
    assert [(j.id, j.attempt, j.state.value) for j in cfg.jobs if j.state.value == "running"] == [("job-17", 3, "running"), ("job-49", 3, "running")]
    assert all(j.attempt == 2 for j in cfg.jobs if j.id not in ("job-17", "job-49"))
    assert ref.path.read_text().count("    # job ") == 50


@pytest.mark.parametrize(("data", "expected"), [
    (b"a: 1\nb: 2\n", (False, False, True)),
    (b"\xef\xbb\xbfa: 1\r\nb: 2\r\n", (True, True, False)),
    (b"#" * ((1 << 16) - 1) + b"\r\nb: 2\n", (False, True, True)),  # the CRLF across two chunks
    (b"#" * ((1 << 16) - 1) + b"\r\nb: 2\r\n", (False, True, False)),  # (its LF is no bare LF)
    (b"#" * (1 << 16) + b"\r\nb: 2\n", (False, True, True)),  # in the second chunk
    (b"#" * ((1 << 16) - 1) + b"\r#\nb: 2\n", (False, False, True)),  # a lone CR at a chunk's end
    (b"\xef\xbb\xbf" + b"#" * 70000 + b"\n", (True, False, True)),
    (b"a\r\n" * 30000 + b"b\n", (False, True, True)),  # the bare LF chunks after the first CRLF
    (b"", (False, False, False)),
])
def test_line_ends_are_read_in_chunks_as_the_whole_file_says(tmp_path, data, expected):
    path = tmp_path / "f.yaml"
    path.write_bytes(data)
    assert stackfile._line_ends(path) == expected == (
        data.startswith(stackfile.BOM.encode()), b"\r\n" in data, data.count(b"\n") > data.count(b"\r\n"))
    assert stackfile._line_ends(tmp_path / "missing.yaml") == (False, False, False)


_LINE = st.text(alphabet="ab: #-", max_size=6)


@settings(max_examples=300, deadline=None)
@given(old=st.lists(st.tuples(_LINE, st.booleans()), max_size=12, unique_by=lambda pair: pair[0]), edits=st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from(["drop", "change", "insert"]), _LINE), max_size=4), last=_LINE)
def test_a_file_of_crlf_and_lf_line_ends_keeps_each_untouched_lines_end(old, edits, last):
    data = "".join(line + ("\r\n" if cr else "\n") for line, cr in old) + last
    lines, kept = [line for line, _ in old], list(range(len(old)))  # the old line each line is (None: new)
    for at, what, line in edits:
        at = min(at, len(lines))
        if what == "insert":
            lines.insert(at, line + "y")  # (new lines never equal an old one, nor do changed ones)
            kept.insert(at, None)
        elif at < len(lines):
            if what == "drop":
                del lines[at], kept[at]
            else:
                lines[at], kept[at] = lines[at] + "x", None
    text = "".join(line + "\n" for line in lines) + last
    out = stackfile._keep_line_ends(data.encode(), text)
    assert out.replace("\r\n", "\n") == text
    ends = [piece.endswith("\r") for piece in out.split("\n")[:-1]]
    assert [cr for was, cr in zip(kept, ends, strict=True) if was is not None] == [
        old[was][1] for was in kept if was is not None]  # every untouched line keeps its own end


def test_line_ends_of_a_file_of_repeated_lines_follow_their_lines_through_many_edits():
    """Stack files repeat lines by the thousand (``state: running``): edits of every tenth job, a job
    removed and one added keep every other line's end (pairing by unique lines, then by position)."""
    def job(i: int, attempt: int = 1) -> list[str]:
        return [f"    - id: job{i}", "      zone: us-east-1a", f"      attempt: {attempt}", "      state: running"]

    jobs = [job(i) for i in range(300)]
    crs = [[i % 3 == 0] * 4 for i in range(300)]  # every third job CRLF
    crs[7][2] = True  # and one line alone
    old = ("config:\n  spotctl:jobs:\n" + "".join(line + ("\r\n" if cr else "\n") for i in range(300)
                                                  for line, cr in zip(jobs[i], crs[i], strict=True))).encode()
    new, ends = ["config:", "  spotctl:jobs:"], [False, False]
    for i in range(300):
        if i == 150:
            continue  # removed: its four lines go
        new += job(i, 2 if i % 10 == 0 else 1)  # every tenth job's attempt edited in place
        ends += crs[i]
    new, ends = new + job(999), ends + [ends[-1]] * 4  # an added job takes the end of the line before it
    out = stackfile._keep_line_ends(old, "".join(line + "\n" for line in new))
    assert out.replace("\r\n", "\n") == "".join(line + "\n" for line in new)
    assert [piece.endswith("\r") for piece in out.split("\n")[:-1]] == ends


@pytest.mark.parametrize("fields", [{"state": "preempted"}, {"attempt": 7, "capacity": "on-demand"},
                                    {"deadlineHours": 12}])  # (a key added)
def test_an_edit_of_a_file_of_crlf_and_lf_line_ends_changes_only_the_edited_lines(ref, fields):
    lines = ref.path.read_bytes().split(b"\n")
    mixed = b"\n".join(line + b"\r" if k % 3 == 0 and k < len(lines) - 1 else line for k, line in enumerate(lines))
    ref.path.write_bytes(mixed)
    set_fields(ref, "vit-finetune", fields)
    before, after = mixed.split(b"\n"), ref.path.read_bytes().split(b"\n")
    diff = difflib.SequenceMatcher(None, [line.rstrip(b"\r") for line in before], [line.rstrip(b"\r") for line in after])
    pairs = [(before[i], after[j]) for i1, j1, size in diff.get_matching_blocks() for i, j in zip(
        range(i1, i1 + size), range(j1, j1 + size), strict=True)]
    assert len(pairs) >= len(before) - 2 and all(old == new for old, new in pairs)  # each kept line as it was
    assert stackfile.job_fields(ref.path, "vit-finetune", list(fields)) == fields


def crc_forged(text: str, index: stackfile._Index) -> str:
    """A valid stack file of the same length and CRC-32 as ``text`` (8 characters of a comment chosen
    by linear algebra over GF(2): a CRC is affine) whose last job is really elsewhere: what the index
    calls its lines is a copy inside its own ``command: |`` text (an audit's attack on a CRC guard)."""
    import zlib

    (_, a0, _), _, (_, c0, c1) = index.spans()
    assert c1 == len(text)
    job = text[c0:c1].split("\n", 1)[1]  # (without its comment line)
    fake = "".join(f"    {line}\n" for line in job.rstrip("\n").split("\n"))
    fake += "          # " + "x" * (c1 - c0 - len(fake) - 13) + "\n"
    # (its command last, so the copy below is that block scalar's text)
    real = text[a0:c0] + re.sub(r"      codeDigest: .*\n", "", job).replace("command: .venv/bin/python train.py --steps 1000",
                                                                         "command: |")
    for comment in ("    # Two-node H100 pretraining: the master keeps one internal IP across preemptions.\n",
                    "    # Single A100 run that was preempted twice and now runs on-demand to make its deadline.\n",
                    "  # relative to the project root (Pulumi.yaml's directory)",
                    "  # recorded by spotctl when it uploaded the archive",
                    "      setup: python3 -m venv .venv && .venv/bin/python -m pip install -r requirements.txt\n"):
        real = real.replace(comment, "")
    pad = c0 - a0 - len(real) - len("  # @@@@@@@@\n")
    assert pad >= 0
    real = "  # " + "-" * pad + "@@@@@@@@\n" + real
    forged_text = text[:a0] + real + fake
    assert len(forged_text) == len(text)
    at, target = forged_text.index("@@@@@@@@"), zlib.crc32(text.encode())

    def crc(chars: list[int]) -> int:
        return zlib.crc32((forged_text[:at] + "".join(map(chr, chars)) + forged_text[at + 8:]).encode())

    base = [0x40] * 8
    start = crc(base)
    basis: list[tuple[int, set]] = []
    for i in range(8):
        for bit in range(5):
            chars = base[:]
            chars[i] ^= 1 << bit
            value, chosen = crc(chars) ^ start, {(i, bit)}
            for b_value, b_chosen in basis:
                if value ^ b_value < value:
                    value, chosen = value ^ b_value, chosen ^ b_chosen
            if value:
                basis.append((value, chosen))
                basis.sort(key=lambda x: -x[0])
    want, chosen = target ^ start, set()
    for b_value, b_chosen in basis:
        if want ^ b_value < want:
            want, chosen = want ^ b_value, chosen ^ b_chosen
    assert want == 0
    chars = base[:]
    for i, bit in chosen:
        chars[i] ^= 1 << bit
    forged_text = forged_text[:at] + "".join(map(chr, chars)) + forged_text[at + 8:]
    assert zlib.crc32(forged_text.encode()) == target and len(forged_text) == len(text)
    return forged_text


def test_a_file_forged_to_the_indexed_length_and_crc_is_edited_where_its_job_really_is(ref):
    """The guard is a cryptographic hash: a same-length, same-CRC-32 file (built in milliseconds) is
    not the indexed text, so the edit goes through the whole file and changes the real job, not the
    copy inside another value at the indexed offsets (a CRC guard edited the copy and said done)."""
    text = ref.path.read_text()
    stackfile.load(ref)
    forged_text = crc_forged(text, stackfile._Index.from_bytes(sealed_payload(stackfile.index_path(ref.path))))
    ref.path.write_text(forged_text)  # a git pull, a hand edit
    stackfile._PARSED.clear()
    cfg = stackfile.load(stackfile.StackRef(STACK, ref.path))
    copy_text = cfg.job("bert-eval").command
    assert copy_text.startswith("- id: bert-eval")  # the file is valid whole: the copy is bert-eval's command
    stackfile.index_path(ref.path).write_bytes(b"")  # (load indexed the new text: put the old index back)
    ref.path.write_text(text)
    stackfile._PARSED.clear()
    stackfile.load(ref)
    ref.path.write_text(forged_text)
    for cache in (stackfile._PARSED, stackfile._LAST_DIGEST, stackfile._LAST_PART, stackfile._LAST_READ, stackfile._LAST_WRITTEN):
        cache.clear()
    set_fields(ref, "bert-eval", {"state": "preempted", "attempt": 3})
    after = stackfile.load(ref).job("bert-eval")
    assert after.state.value == "preempted" and after.attempt == 3 and after.command == copy_text


def test_an_index_sealed_by_another_key_is_ignored(ref, validated):
    """A cache file carried by a commit or written by anyone without this user's key: the whole file."""
    stackfile.load(ref)
    path = stackfile.index_path(ref.path)
    payload, ours = sealed_payload(path), cachefile._KEY[:]
    cachefile._KEY[:] = [b"k" * cachefile.KEY_BYTES]  # another user's spotctl
    try:
        cachefile.write(path, payload)
    finally:
        cachefile._KEY[:] = ours
    assert path.read_bytes().endswith(payload) and cachefile.read(path, stackfile.CACHE_LIMIT) is None
    stackfile._PARSED.clear()
    validated.clear()
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert validated and max(validated) == 3  # the whole file


@pytest.mark.parametrize("hostile", ["deep", "fifo", "huge", "link"])
def test_a_hostile_cache_file_never_stops_or_hangs_a_command(ref, runner, hostile, tmp_path):
    """A damaged or hostile index or status cache (deeply nested JSON, a FIFO, a link to a device) only
    means the whole file: the command still works, no traceback, no wait."""
    from cli.app import app
    from cli.lifecycle.status import status_cache_path

    assert runner.invoke(app, ["status", "--stack-file", str(ref.path)]).exit_code == 0  # (the status cache's entries)
    entries = sorted(status_cache_path(ref.path).iterdir())
    for path in (stackfile.index_path(ref.path), *entries):
        path.unlink(missing_ok=True)
        if hostile == "deep":
            cachefile.write(path, b"[" * 100_000)
        elif hostile == "fifo":
            os.mkfifo(path)
        elif hostile == "huge":
            path.symlink_to("/dev/zero")
        else:
            (tmp_path / "elsewhere").write_bytes(b"x")
            path.symlink_to(tmp_path / "elsewhere")
    stackfile._PARSED.clear()
    result = runner.invoke(app, ["status", "--stack-file", str(ref.path)])
    assert result.exit_code == 0, result.output
    set_fields(ref, "vit-finetune", {"state": "preempted"})
    assert stackfile.load(ref).job("vit-finetune").state.value == "preempted"


def test_a_file_with_cr_line_ends_loads_and_is_not_indexed(ref):
    """YAML breaks lines at a lone CR too; the index counts LF lines: such a file is simply not indexed."""
    ref.path.write_bytes(ref.path.read_bytes().replace(b"\n", b"\r"))
    stackfile.index_path(ref.path).unlink(missing_ok=True)
    assert [j.id for j in stackfile.load(ref).jobs] == ["llm-pretrain", "vit-finetune", "bert-eval"]
