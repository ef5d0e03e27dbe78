import errno
import os
import threading

import pytest

from gptlite.training.background import FileWriter, WriteError

pytestmark = pytest.mark.once("the file writer is plain Python")

# Each test's writes wait for an event set by the test itself, never for a clock.
WAIT = 60


@pytest.fixture
def held_fsync(monkeypatch):
    """os.fsync held until the test releases it: a disk that syncs as slowly as the test wants."""
    release, entered = threading.Event(), threading.Event()
    fsync = os.fsync

    def slow_fsync(descriptor):
        entered.set()
        assert release.wait(WAIT), "the test never released the disk"
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    return release, entered


def test_a_write_returns_at_once_and_the_file_appears_whole_once_synced(tmp_path, held_fsync):
    release, entered = held_fsync
    (tmp_path / "a.txt").write_text("old")
    with FileWriter() as writer:
        writer.write(tmp_path / "a.txt", lambda path: path.write_text("new"))
        assert entered.wait(WAIT)  # the writer's thread is syncing; the caller went on
        assert (tmp_path / "a.txt").read_text() == "old"
        release.set()
    assert (tmp_path / "a.txt").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]  # no temporary file left


def test_on_written_comes_once_each_write_is_over_written_dropped_or_failed(tmp_path, held_fsync):
    release, entered = held_fsync
    over = []
    writer = FileWriter()
    writer.write(tmp_path / "c.npz", lambda path: path.write_text("1"), on_written=lambda: over.append(1))
    assert entered.wait(WAIT)
    writer.write(tmp_path / "c.npz", lambda path: path.write_text("2"), on_written=lambda: over.append(2))
    writer.write(tmp_path / "c.npz", lambda path: path.write_text("3"), on_written=lambda: over.append(3))
    assert over == []  # the first is held; the others wait behind it
    release.set()
    writer.close()
    assert over == [1, 2, 3] and (tmp_path / "c.npz").read_text() == "3"
    assert writer.written == 2  # the second was dropped for the third, which came before it started


def test_a_write_not_yet_started_is_dropped_for_a_newer_one_of_its_file(tmp_path, held_fsync):
    release, entered = held_fsync
    produced = []
    with FileWriter() as writer:
        writer.write(tmp_path / "first", lambda path: path.write_text("x"))
        assert entered.wait(WAIT)  # held: the writes below wait in the queue
        for number in range(3):
            writer.write(tmp_path / "history.csv", lambda path, n=number: (produced.append(n), path.write_text(str(n))),
                         sync=False)
        release.set()
    assert produced == [2] and (tmp_path / "history.csv").read_text() == "2"


def test_a_failed_write_is_raised_at_the_next_call_and_leaves_the_earlier_file(tmp_path, monkeypatch):
    (tmp_path / "checkpoint.npz").write_text("the last good checkpoint")

    def full_disk(descriptor):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    writer = FileWriter()
    writer.write(tmp_path / "checkpoint.npz", lambda path: path.write_text("new"))
    with pytest.raises(WriteError, match=r"cannot write .*checkpoint.npz: No space left on device"):
        writer.wait()
    with pytest.raises(WriteError):
        writer.close()
    assert (tmp_path / "checkpoint.npz").read_text() == "the last good checkpoint"
    assert os.listdir(tmp_path) == ["checkpoint.npz"]


def test_the_caller_s_own_error_goes_on_and_the_write_in_flight_still_finishes(tmp_path, held_fsync):
    release, entered = held_fsync

    with pytest.raises(KeyError):
        with FileWriter() as writer:
            writer.write(tmp_path / "model.keras", lambda path: path.write_text("whole"))
            assert entered.wait(WAIT)
            release.set()
            raise KeyError("the caller's")
    assert (tmp_path / "model.keras").read_text() == "whole"


def test_a_file_synced_at_close_is_renamed_whole_at_once_and_its_last_version_synced_when_the_writer_closes(
        tmp_path, monkeypatch):
    synced = []  # the contents of each file as it was synced
    fsync = os.fsync

    def recorded_fsync(descriptor):
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}") if os.path.exists("/proc/self/fd") else "")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    writer = FileWriter()
    for number in range(3):
        writer.write(tmp_path / "model.keras", lambda path, n=number: path.write_text(str(n)), sync="at close")
        writer.wait()
        assert (tmp_path / "model.keras").read_text() == str(number)
    assert synced == []  # three versions, renamed into place, none synced yet
    writer.close()
    assert len(synced) == 1 and (tmp_path / "model.keras").read_text() == "2"
    assert synced[0] in ("", str(tmp_path / "model.keras"))  # the file itself, not a temporary one
    with FileWriter() as other, pytest.raises(ValueError, match="sync is True, False or"):
        other.write(tmp_path / "x", lambda path: None, sync="later")
