"""The suite's own scheduling (tests/conftest.py): the files it takes first exist, and come first."""

from __future__ import annotations

from pathlib import Path

from conftest import LONGEST_FILES_FIRST, pytest_collection_modifyitems


def test_every_file_taken_first_exists():
    here = Path(__file__).parent
    missing = [name for name in LONGEST_FILES_FIRST if not (here / name).is_file()]
    assert not missing, f"renamed or removed; update LONGEST_FILES_FIRST: {missing}"


class _Item:
    def __init__(self, file: str, name: str):
        self.path = Path("tests") / file
        self.name = name


def test_the_longest_files_come_first_then_the_files_with_most_tests():
    first, second = LONGEST_FILES_FIRST[:2]
    items = [
        _Item("test_a.py", "one"),
        _Item(second, "x"),
        _Item("test_b.py", "one"),
        _Item("test_b.py", "two"),
        _Item(first, "y"),
        _Item(first, "z"),
    ]
    pytest_collection_modifyitems(None, None, items)
    assert [(item.path.name, item.name) for item in items] == [
        (first, "y"),
        (first, "z"),
        (second, "x"),
        ("test_b.py", "one"),
        ("test_b.py", "two"),
        ("test_a.py", "one"),
    ]
