"""kubetune.atomic_write: a reader sees the old content or the new, never a part; a failed
or killed write leaves no temporary file the next run would have to clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from kubetune.atomic_write import atomic_path, write_atomic


def test_replaces_content_and_leaves_only_the_target(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("old")
    write_atomic(target, '{"steps": 3}')
    write_atomic(tmp_path / "script", b"#!/bin/sh\n", executable=True)
    assert target.read_text() == '{"steps": 3}'
    assert os.stat(tmp_path / "script").st_mode & 0o777 == 0o755
    assert sorted(p.name for p in tmp_path.iterdir()) == ["script", "summary.json"]


def test_a_failing_writer_keeps_the_old_content_and_no_temporary(tmp_path):
    target = tmp_path / "kubetune-curves.png"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a pl")
            raise RuntimeError("the plot failed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["kubetune-curves.png"]


def test_file_and_directory_are_synced_before_and_after_the_rename(tmp_path, monkeypatch):
    # A rename is durable only once the directory is synced, and the new content only
    # once the file is: both must happen, in that order around os.replace.
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        return real_fsync(fd)

    def replace(a, b):
        events.append("replace")
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "resume.json", "{}")
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_a_kill_inside_the_write_leaves_the_old_content(tmp_path):
    # SIGKILL while the new content is half written: the reader still sees the old file.
    target = tmp_path / ".kubetune-manifest.json"
    target.write_text('{"old": true}')
    script = textwrap.dedent(f"""
        import os, signal
        from kubetune.atomic_write import atomic_path
        with atomic_path({str(target)!r}) as tmp:
            tmp.write_text('{{"new": tr')
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert result.returncode == -signal.SIGKILL
    assert target.read_text() == '{"old": true}'
