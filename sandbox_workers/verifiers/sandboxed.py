"""The verifiers that run the candidate's code in the sandbox.

python_tests: `code` is the module `solution` (solution.py in the job's scratch dir);
`tests` is a Python file of pytest-style `test_*` functions (and `Test*` classes) with
plain asserts that import from `solution`; each test function (each parameter set of a
`pytest.mark.parametrize`) is one counted test. The tests run in a trusted harness that
calls into the candidate's process with plain data only (deploy/sandbox/files/harness.py).
The candidate's exceptions reach the tests as mirrors of their declared builtin type:
`except ValueError` and `pytest.raises(ValueError)` match them, `isinstance(e, ValueError)`
does not, and no implicit control flow (the end of an iteration, a generator's close, an
interpreter exit) takes them for its own.

stdin_stdout: `code` is a program run once per case, fresh each time, with the case's
stdin; its whole stdout is compared with the case's under this rule: trailing spaces,
tabs, CR, FF and VT at the end of each line and trailing empty lines are ignored;
everything else (leading spaces, blank lines in between, letter case) must match. A case
passes when the program exits 0 and the output matches.
"""

from __future__ import annotations

from typing import Any

import msgspec

from schemas.sandbox import SandboxRequest, VerifierSpec


def feedback_spec(spec: VerifierSpec) -> VerifierSpec | None:
    """The spec a multi-turn observation may run: a python_tests spec whose `tests` are the
    public `feedback_tests` (the hidden scoring tests and their expected values must never
    reach the policy). None when the task has no public tests."""
    if spec.name != "python_tests" or not spec.feedback_tests:
        return None
    return msgspec.structs.replace(spec, tests=spec.feedback_tests, feedback_tests=None)


class PythonTests:
    name = "python_tests"
    version = "1.1"
    """1.1: the candidate's exceptions are matched only by an explicit except/pytest.raises
    of their declared type; a dead candidate fails every later test; a failed import of the
    solution outranks a failing import of the tests (issue 12)."""

    def problem(self, spec: VerifierSpec) -> str | None:
        if not spec.tests or not spec.tests.strip():
            return "no tests (VerifierSpec.tests is empty)"
        return None

    def job(self, request: SandboxRequest) -> dict[str, Any]:
        return {"mode": "python_tests", "code": request.code, "tests": request.verifier.tests}


class StdinStdout:
    name = "stdin_stdout"
    version = "1.1"
    """1.1: a case whose processes or files cannot be removed ends the job; the cases not
    run count as failed (issue 12)."""

    def problem(self, spec: VerifierSpec) -> str | None:
        return None if spec.cases else "no cases (VerifierSpec.cases is empty)"

    def job(self, request: SandboxRequest) -> dict[str, Any]:
        cases = [{"stdin": c.stdin, "stdout": c.stdout} for c in request.verifier.cases]
        return {"mode": "stdin_stdout", "code": request.code, "cases": cases}
