"""README's count of bad inputs is the table's (tests/test_inputs.py: CASES for train.py and the `hybrid` commands,
SCRIPT_CASES for the scripts): a new case without a README update fails here, so the number cannot go stale."""

from __future__ import annotations

import os
import re

import test_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_counts_the_bad_inputs_of_the_table():
    text = " ".join(open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().split())
    m = re.search(r"`tests/test_inputs\.py`: (\d+) bad inputs, (\d+) of train\.py and the `hybrid` commands and "
                  r"(\d+) of the scripts", text)
    assert m, "README.md no longer states the bad-input count in the expected words"
    total, commands, scripts = map(int, m.groups())
    assert (commands, scripts) == (len(test_inputs.CASES), len(test_inputs.SCRIPT_CASES))
    assert total == commands + scripts
