"""Which word of ``python [OPTIONS] SCRIPT`` is the script (hpc_train.config.command_paths), as python's own
command line reads it (python(1): one-letter options may be grouped; -c and -m end the options; -W and -X take
the rest of the word or the next one)."""

import pytest

from hpc_train.config.command_paths import script_index


@pytest.mark.parametrize("argv, want", [
    (("python", "train.py"), 1),
    (("python", "-u", "-W", "ignore", "sub/train.py"), 4),
    (("python", "-Wignore", "train.py"), 2),
    (("python", "-uX", "dev", "train.py"), 3),
    (("python", "-OO", "train.py"), 2),
    (("python", "--check-hash-based-pycs", "always", "train.py"), 3),
    (("python", "-uc", "print(1)"), None),   # grouped -c: the next word is code, not a file
    (("python", "-Bm", "pkg"), None),        # grouped -m: a module
    (("python", "-cprint(1)"), None),
    (("python", "-m", "pkg"), None),
    (("python", "-"), None),
    (("python",), None),
    (("bash", "train.sh"), None),
])
def test_the_script_is_the_word_python_would_run(argv, want):
    assert script_index(argv) == want
