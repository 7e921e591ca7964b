"""What the dev stack says about the disk under its state directory, as free space falls,
runs out and comes back (shepherd/diskroom.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shepherd import diskroom


def test_the_watch_says_each_change_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    free: list[int | None] = [10 * diskroom.LOW_BYTES]
    monkeypatch.setattr(diskroom, "free_bytes", lambda _: free[0])
    monkeypatch.setattr(diskroom, "CHECK_EVERY_S", 0.0)
    said: list[str] = []
    watch = diskroom.Watch(tmp_path, said.append)
    for room in (10 * diskroom.LOW_BYTES, 20 * 2**20, 19 * 2**20, 0, 0, 2 * diskroom.LOW_BYTES):
        free[0] = room
        watch.check()
    assert len(said) == 3, said
    assert said[0].startswith(f"warning: the disk under {tmp_path} is nearly full (20 MiB free)")
    assert said[1].startswith(f"warning: the disk under {tmp_path} is full:")
    assert said[2] == f"space is back under {tmp_path}: jobs go on"
    free[0] = None  # the directory is gone: nothing to say
    assert diskroom.shortage(tmp_path) is None
