#!/usr/bin/python3
"""Runs rdma-core's own pyverbs test suite, unmodified, and prints one line
per test that a shell script can judge:

    RESULT <module> <Class.method> <ok|skip|fail|error> [reason]

Usage: run_suite.py SUITE_DIR [SUITE ARGS ...] -- MODULE ...

SUITE_DIR is a copy of Debian's /usr/share/doc/rdma-core/tests with the
gzipped files unpacked; SUITE ARGS go to the suite's own argument parser
(args_parser.py: --dev, --port, --gid, ...), as run_tests.py would pass
them. Each MODULE (test_pd, test_qp, ...) is imported as tests.MODULE, as
`python3 -m unittest tests.MODULE` would, and run with unittest's own
runner; only the result object is ours, so that a test's name is its id
and never its docstring (unittest -v prints the docstring's first line).
"""
import os
import sys
import unittest


def main():
    if '--' not in sys.argv[2:]:
        sys.exit('usage: run_suite.py SUITE_DIR [SUITE ARGS ...] -- MODULE ...')
    suite_dir = os.path.abspath(sys.argv[1])
    split = sys.argv.index('--', 2)
    suite_args, modules = sys.argv[2:split], sys.argv[split + 1:]
    if not modules:
        sys.exit('run_suite.py: no MODULE given')

    # The suite's modules import `args_parser` (a top-level module in the
    # suite's folder) and `tests.base`, `tests.utils` (the folder as the
    # package `tests`): both folders go on the path, as run_tests.py has it.
    sys.path[:0] = [suite_dir, os.path.dirname(suite_dir)]
    if os.path.basename(suite_dir) != 'tests':
        sys.exit(f'run_suite.py: {suite_dir} must be a folder named tests')
    from args_parser import parser
    sys.argv = [sys.argv[0]] + suite_args
    parser.parse_args()

    # The RESULT lines keep stdout to themselves; whatever the tests print
    # (pyverbs' RDMA CM sides print their exception to stdout before they
    # exit) goes to stderr, between the START lines, beside its traceback.
    results = os.fdopen(os.dup(1), 'w', buffering=1)
    os.dup2(2, 1)

    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for module in modules:
        # A module that does not import is a failure of the run, not a skip.
        suite.addTests(loader.loadTestsFromName(f'tests.{module}'))
    result = Result(results)
    suite.run(result)
    sys.stdout.flush()
    results.flush()
    return 0


class Result(unittest.TestResult):
    """Prints each outcome as it happens, so a crash mid-run (a signal in
    the library) still leaves the lines of the tests before it."""

    def __init__(self, out):
        super().__init__()
        self._out = out

    def _line(self, test, outcome, reason=''):
        # id: tests.test_qp.QPTest.test_create_rc_qp_no_attr
        parts = test.id().split('.')
        module = parts[1] if len(parts) > 2 else parts[0]
        name = '.'.join(parts[2:]) if len(parts) > 2 else test.id()
        reason = ' '.join(str(reason).split())[:300]
        print(f'RESULT {module} {name} {outcome} {reason}'.rstrip(), file=self._out, flush=True)

    def startTest(self, test):
        super().startTest(test)
        # The traceback of a failure goes to stderr, above its RESULT line.
        print(f'START {test.id()}', file=sys.stderr, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line(test, 'ok')

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line(test, 'skip', reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._report(test, 'fail', err)

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass/setUpModule errors come as a _ErrorHolder "test".
        self._report(test, 'error', err)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._line(test, 'ok', 'expected failure')

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._line(test, 'fail', 'unexpected success')

    def _report(self, test, outcome, err):
        text = self._exc_info_to_string(err, test)
        print(text, file=sys.stderr, flush=True)
        last = text.strip().splitlines()[-1] if text.strip() else ''
        self._line(test, outcome, last)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = 'fail' if issubclass(err[0], test.failureException) else 'error'
            self._report(subtest, outcome, err)


if __name__ == '__main__':
    sys.exit(main())
