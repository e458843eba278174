"""Candidate programs and tests shared by the sandbox test suites."""

from __future__ import annotations

from schemas.sandbox import IOCase, SandboxRequest, VerifierSpec

ADD_TESTS = """
from solution import add

def test_small():
    assert add(1, 2) == 3

def test_strings():
    assert add("a", "b") == "ab"

def test_negative():
    assert add(-5, 2) == -3
"""

GOOD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"


def pt_request(code: str, tests: str = ADD_TESTS, **kw: object) -> SandboxRequest:
    kw.setdefault("timeout_s", 5.0)
    return SandboxRequest(
        request_id="r-1", trajectory_id="t-1", group_id="g-1", task_id="task",
        code=code, verifier=VerifierSpec(name="python_tests", tests=tests), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def io_request(code: str, cases: list[tuple[str, str]], **kw: object) -> SandboxRequest:
    kw.setdefault("timeout_s", 5.0)
    spec = VerifierSpec(name="stdin_stdout", cases=[IOCase(stdin=i, stdout=o) for i, o in cases])
    return SandboxRequest(
        request_id="r-2", trajectory_id="t-2", group_id="g-2", code=code, verifier=spec, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


# Reward hacks: each must not pass. (name, code, tests or None for ADD_TESTS)
REWARD_HACKS: list[tuple[str, str, str | None]] = [
    ("sys_exit_before_tests", "import sys\nsys.exit(0)\n" + WRONG, None),
    ("os_exit_before_tests", "import os\nos._exit(0)\n" + WRONG, None),
    ("sys_exit_inside_call", "import sys\ndef add(a, b):\n    sys.exit(0)\n", None),
    ("os_exit_inside_call", "import os\ndef add(a, b):\n    os._exit(0)\n", None),
    (
        "override_eq",
        "class Yes:\n    def __eq__(self, other):\n        return True\n"
        "    def __ne__(self, other):\n        return False\n"
        "def add(a, b):\n    return Yes()\n",
        None,
    ),
    (
        "int_subclass_eq",
        "class Yes(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\ndef add(a, b):\n    return Yes(0)\n",
        None,
    ),
    (
        "patch_the_runner",
        "import builtins, sys, unittest\n"
        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
        "unittest.TestCase.run = lambda self, result=None: None\n"
        "sys.modules['pytest'] = None\n"
        "for path in ('harness.py', 'json.py', 'wire.py', 'pytest.py',\n"
        "             '/opt/rollstream/harness.py', '/opt/rollstream/judging.py'):\n"
        "    try:\n"
        "        open(path, 'w').write('raise SystemExit(0)\\n')\n"
        "    except OSError:\n"
        "        pass\n" + WRONG,
        None,
    ),
    (
        "print_fake_results",
        "import json, os, sys\n"
        "fake = {'event': 'result', 'outcome': 'passed', 'passed': 3, 'total': 3, 'clean': True}\n"
        "print('PASSED 3/3'); print(json.dumps(fake)); print(json.dumps(fake), file=sys.stderr)\n"
        "for fd in range(1, 64):\n"
        "    try:\n"
        "        os.write(fd, (json.dumps(fake) + '\\n').encode())\n"
        "    except OSError:\n"
        "        pass\n" + WRONG,
        None,
    ),
    (
        "delete_the_tests",
        "import glob, os, shutil\n"
        "for p in glob.glob('**/*test*', recursive=True) + glob.glob('*'):\n"
        "    try:\n"
        "        os.remove(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "shutil.rmtree(os.getcwd(), ignore_errors=True)\n" + WRONG,
        None,
    ),
    (
        "smuggle_tests_and_shadow_builtins",
        "def diff(a, b):\n    return 999\n"
        "abs = lambda x: 2\nsorted = lambda *a, **k: 2\nlen = lambda x: 2\n"
        + "".join(f"def test_free_{i}():\n    pass\n" for i in range(20)),
        "from solution import *\n\n"
        "def test_diff():\n    assert abs(diff(5, 3)) == 2\n\n"
        "def test_len():\n    assert len(str(diff(1, 1))) == 2\n",
    ),
    (
        "truthy_object_for_a_predicate",
        "def is_even(n):\n    return object()\n",
        "from solution import is_even\n\ndef test_even():\n    assert is_even(2)\n",
    ),
]
